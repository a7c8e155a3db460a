#include "shm_slice.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace tutti::shm_backend {
namespace {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h, SCHED_ATTR_SIZE_VER1: 56
// bytes); glibc 2.36 declares neither it nor the two calls.
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;  // for the fair class: the slice (Linux 6.12 and later)
  uint64_t deadline;
  uint64_t period;
  uint32_t util_min;
  uint32_t util_max;
};
static_assert(sizeof(SchedAttr) == 56, "struct sched_attr, version 1");

constexpr uint64_t kResetOnFork = 0x01;  // SCHED_FLAG_RESET_ON_FORK

bool get_attr(SchedAttr& a) {
  std::memset(&a, 0, sizeof a);
  return ::syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) == 0;
}

// The policies whose slice a thread may set (SCHED_IDLE is of the fair class too, but is left
// as it is).
bool fair(const SchedAttr& a) {
  return a.policy == SCHED_OTHER || a.policy == SCHED_BATCH;
}

}  // namespace

uint64_t current_slice_ns() {
  SchedAttr a;
  return get_attr(a) ? a.runtime : 0;
}

bool slices_apply_to_this_thread() {
  SchedAttr a;
  return get_attr(a) && fair(a) && a.runtime != 0;
}

SliceAnswer ask_for_short_slices(uint64_t slice_ns) {
  // The kernel's bounds for a fair thread's slice (sched_setattr clamps to them).
  slice_ns = std::clamp<uint64_t>(slice_ns, 100'000, 100'000'000);
  SchedAttr a;
  if (!get_attr(a)) return SliceAnswer::kRefused;
  if (!fair(a)) return SliceAnswer::kNotFair;
  // Before 6.12 the fair class reports no slice (0) and sched_setattr ignores one.
  if (a.runtime == 0) return SliceAnswer::kNoCustomSlices;
  if (a.runtime <= slice_ns) return SliceAnswer::kShortAlready;
  SchedAttr want = a;
  want.size = sizeof want;
  want.flags = a.flags & kResetOnFork;  // the policy and nice as read; util clamps untouched
  want.priority = 0;
  want.runtime = slice_ns;
  if (::syscall(SYS_sched_setattr, 0, &want, 0) != 0) return SliceAnswer::kRefused;
  return current_slice_ns() == slice_ns ? SliceAnswer::kShortened : SliceAnswer::kNoCustomSlices;
}

const char* describe(SliceAnswer answer) {
  switch (answer) {
    case SliceAnswer::kShortened: return "shortened";
    case SliceAnswer::kShortAlready: return "already that short";
    case SliceAnswer::kNoCustomSlices:
      return "this kernel keeps no slice per thread (Linux < 6.12)";
    case SliceAnswer::kNotFair: return "not a SCHED_OTHER or SCHED_BATCH thread: left alone";
    case SliceAnswer::kRefused: return "sched_getattr or sched_setattr failed";
  }
  return "?";
}

}  // namespace tutti::shm_backend
