// Short scheduler slices for threads that wait on their peers (internal to the shm backend;
// issue 20).
//
// With more ranks than CPUs, a rank's waits do not poll: it sleeps on a futex, and the peer that
// completes the step wakes it. Where other processes keep the CPUs busy as well, the woken rank
// waited for the running process's slice to end, which this kernel (Linux 6.18, EEVDF, HZ=250)
// sees at its next tick: every step of every op took 4 or 8 ms. Measured 2026-12-06 on 2 vCPUs,
// 4 ranks and two `yes`: 8 B-32 KiB allreduces 7.99-8.02 ms each in 3 of 3 runs, Open MPI's
// shared memory 8-12 ms. Since Linux 6.12 a thread of the fair class may ask for a shorter slice
// (sched_attr.sched_runtime, 0.1-100 ms, no privilege needed): its deadline on waking is then
// close, and the wake-up preempts the busy process at once. With 100 us: 3.3-5.1 us per 8 B-32 KiB
// op in the same state, 111-121 us at 256 KiB against 8 ms (one run 3.9 ms). A thread's weight,
// and so its share of the CPU, stays as it was; it is only preempted sooner itself (every 100 us
// where its CPU is contended). Asked once per thread, by the first wait of an oversubscribed
// group (TUTTI_SHM_SLICE_US, default 100; 0: never), and kept: threads the thread starts and
// processes it forks inherit it, as any scheduling attribute.
#pragma once

#include <cstdint>

namespace tutti::shm_backend {

enum class SliceAnswer : uint8_t {
  kShortened,       // the thread's slice is now the one asked for
  kShortAlready,    // it was that short or shorter: left as it was
  kNoCustomSlices,  // the kernel keeps no slice per thread (before Linux 6.12)
  kNotFair,         // another policy than SCHED_OTHER or SCHED_BATCH (real-time, SCHED_IDLE)
  kRefused,         // sched_getattr or sched_setattr failed (seccomp, an old kernel)
};

// Asks the scheduler for slices of `slice_ns` (within the kernel's 0.1-100 ms) for the calling
// thread, keeping its policy, nice value and other attributes.
SliceAnswer ask_for_short_slices(uint64_t slice_ns);
// The calling thread's slice as the kernel reports it (ns; 0 where it reports none or fails).
uint64_t current_slice_ns();
// Whether the calling thread could be given a slice: SCHED_OTHER or SCHED_BATCH, on a kernel
// that reports one.
bool slices_apply_to_this_thread();
const char* describe(SliceAnswer answer);

}  // namespace tutti::shm_backend
