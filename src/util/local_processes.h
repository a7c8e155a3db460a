// The processes of this user that run tutti groups on this kernel, whatever host id, network
// namespace or group they belong to (internal).
//
// Why: whether a rank may spin while it waits depends on how many processes compete for its
// CPUs, and a group sees only its own ranks. Two "hosts" of two ranks each in network namespaces
// on a 2-CPU machine are four processes on two CPUs: a rank spinning for its shm peer starved
// the other host's leader that it waited for through Gloo (4-8 ms per 8-byte allreduce, the
// slow regime of the cross-host comparison). So every process that creates a group registers
// once, and the shm backend counts the registered processes that may run on its ranks' CPUs.
//
// The table is /dev/shm/tutti-processes.<uid> (mode 0600): a slot per process (pid, start time,
// affinity mask, when it last ran an op), claimed with a compare-and-swap, left behind at exit
// and reused once its process is gone (its pid and start time no longer match /proc). Where the
// table cannot be opened, only this process counts.
//
// Only processes that ran an op within kIdleAfter count: one that holds a group and does
// nothing with it (a notebook's kernel, a driver between jobs) takes no CPU. Counted, it put
// every other job's shm ranks on the host into yielding instead of polling: an 8-byte allreduce
// at 2 ranks went from 0.26 to 0.8-1.2 us beside one idle Python process holding two groups.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace tutti::detail {

constexpr std::chrono::milliseconds kIdleAfter{2000};

// Registers the calling process (once per process; again after a fork). Never throws. It counts
// as active from now.
void register_local_process() noexcept;

// Tests only: called while a registration holds its slot half filled in (its pid written, its
// start not yet), so that a test can count processes then.
extern void (*local_process_claim_pause)();

// Notes that this process runs an op at `now` (the steady clock): every op calls it; it writes
// the table at most every 100 ms (one load and a compare in line otherwise). Never throws.
extern std::atomic<int64_t> next_activity_note;  // the steady clock's count, from when it writes
void note_local_activity_now(std::chrono::steady_clock::time_point now) noexcept;
inline void note_local_activity(std::chrono::steady_clock::time_point now) noexcept {
  if (now.time_since_epoch().count() < next_activity_note.load(std::memory_order_relaxed)) return;
  note_local_activity_now(now);
}

// The registered processes, alive, other than this one, that may run on at least one CPU of
// `cpus` and ran an op (or registered) within kIdleAfter (their pids). A slot of a tutti that
// did not note activity yet (an older one) always counts.
std::vector<long> local_processes(const cpu_set_t& cpus);

// How many processes compete for `cpus`: those, and this one (registered or not).
int count_local_processes(const cpu_set_t& cpus) noexcept;

}  // namespace tutti::detail
