// Why a test of shm's short scheduler slices (backends/shm/shm_slice.h) cannot run on this
// thread: shared by shm_spin_test and shm_test, which compile shm_slice.cc in.
#pragma once

#include <sched.h>

#include <cstdint>
#include <string>

#include "../backends/shm/shm_slice.h"

namespace tutti::testing {

// "" where it can: the thread is of the fair class, the kernel keeps a slice per thread, and
// that slice is longer than `longest_asked_ns`, the longest slice the test asks for.
inline std::string why_slices_cannot_be_tested(uint64_t longest_asked_ns) {
  const int policy = ::sched_getscheduler(0);
  if (policy != SCHED_OTHER && policy != SCHED_BATCH) {
    return "this test runs under scheduling policy " + std::to_string(policy) +
           ", not SCHED_OTHER or SCHED_BATCH";
  }
  const uint64_t usual = shm_backend::current_slice_ns();
  if (usual == 0) return "this kernel reports no slice per thread (before Linux 6.12)";
  if (usual <= longest_asked_ns) return "this process already runs with a short slice";
  return "";
}

}  // namespace tutti::testing
