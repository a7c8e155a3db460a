// What the shm backend's files share beyond its header: one op in flight, one message of a
// batch, and the wait every step of them ends in (internal).
#pragma once

#include <sched.h>

#include <functional>

#include "shm_backend.h"
#include "shm_cpus.h"
#include "shm_layout.h"
#include "tutti/error.h"
#include "util/op_clock.h"

namespace tutti::shm_backend {

// One collective in flight.
struct ShmBackend::Op {
  const OpContext& ctx;
  Clock::time_point deadline;
  uint32_t seq;            // this backend's collective count, the same on every rank (from 1)
  uint32_t parity;         // seq & 1: which of two slots this op uses
  bool checked = false;    // the tags have been compared
  int symmetric = 0;       // ranks whose tag carried kSymmetricTag, counted by the tag check
  bool announced = false;  // this rank's tag carried it (announce_symmetric)
  PublishTimer* timer = nullptr;  // a timed staged op's (its barriers' waits are not its cost)
};

// One message of a batch in flight.
struct ShmBackend::Transfer {
  const P2PRequest* request;
  size_t bytes = 0;             // the whole message
  size_t done = 0;              // bytes sent (or received) so far
  PublishChooser::Pick how{};   // a send's way into the mailbox (picked at its first chunk)
  Clock::time_point started{};  // a timed send's third chunk (after the receiver's first ack)
  long switches = 0;            // this thread's involuntary context switches then
  int64_t cpu_ns = 0;           // and its CPU time
  bool finished() const { return done == bytes; }
};

// Whether a wait's stillness look counts rank r: still_of's ranks, or (none given) all it waits on.
template <typename StillOf>
bool watches_for_still(const StillOf& still_of, int r) {
  return still_of(r);
}
inline bool watches_for_still(bool (*still_of)(int), int r) {
  return still_of == nullptr || still_of(r);
}

template <typename Ready, typename WaitingOn, typename OnTimeout, typename StillOf>
void ShmBackend::wait_until(Ready ready, std::atomic<uint32_t>& word,
                            std::atomic<uint32_t>& sleepers, const OpContext& ctx, uint64_t op_seq,
                            Clock::time_point deadline, WaitingOn waiting_on, OnTimeout on_timeout,
                            const Op* op, StillOf still_of) {
  // Oversubscribed: the thread's short slices, asked once (before the quick return, so that every
  // thread that runs ops asks, whether or not its first waits had to wait).
  if (slice_ns_ != 0) shorten_slice_once();
  if (ready() && !aborted_.load(std::memory_order_relaxed)) return;
  const std::function<bool(int)> waiting(waiting_on);
  // After each sleep: a peer we wait on that is gone ends the wait, unless what it did before
  // going satisfied the condition.
  auto check_peers = [&] {
    if (auto gone = gone_peer(ctx, waiting); gone && !ready()) throw *gone;
    if (op != nullptr && !ready()) check_agreement(*op);
  };
  // Polling makes sense only while the ranks waited for run elsewhere: one that shares this
  // rank's CPU (unbound ranks, placed there by the scheduler) runs only once this rank gives the
  // CPU up, so the polls stop as soon as one is seen there (where the CPU cannot be read, they run
  // their course). A rank notes its CPU at each op and around each wait (point-to-point waits
  // have no op), so a peer's note is at most one op old.
  //
  // Nor, where this rank's own CPU is contended (it lost its CPU to another thread lately), while
  // every rank waited for sits inside a wait of its own without polling (StillWatch): that rank is
  // off its CPU, preempted as it polled (or asleep). Polling on would only burn this rank's own
  // turn on its CPU; asleep, it is rung when that rank comes back, and runs with it. Measured
  // 2026-12-06 (2 vCPUs, a loop of 2-job builds beside 2 ranks, Linux 6.18): each rank shared its
  // CPU with a compiler and got alternate slices; once the two ranks' turns fell out of step, each
  // polled away its whole slice for a peer whose slice came next, and 8 B-8 KiB allreduces took
  // 8 ms each in bursts of 100 ops and more, while the medians stayed at 0.5-2.5 us. A rank that
  // sleeps comes back with its peer, and from then on their turns fall together. Where its CPU
  // has nothing else to run (a hog beside the other rank only), it polls on: asleep, it would
  // only add its wake-up, and leave its CPU to the hog.
  note_cpu();
  bool slept_for_still = false;  // keep_spinning sent the wait to sleep (not the budget's end)
  StillWatch still(kBeatFrom, still_looks_);
  auto keep_spinning = [&]() -> int {
    const int cpu = ::sched_getcpu();
    const uint32_t here = cpu < 0 ? 0 : static_cast<uint32_t>(cpu) + 1;
    // Waits that end within kBeatFrom looks touch no beat (a peer's beat line is a cache miss).
    if (still.begin_look()) {
      beats_ += 2;
      bells_[rank_].beat.value.store(beats_ | 1, std::memory_order_relaxed);
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_ || !waiting(r)) continue;
      if (here != 0 && bells_[r].cpu.value.load(std::memory_order_relaxed) == here) {
        return kStopPolling;
      }
      if (still.watching() && watches_for_still(still_of, r)) {
        still.peer(bells_[r].beat.value.load(std::memory_order_relaxed), seen_beat_[r]);
      }
    }
    if (!still.end_look() || !thread_lost_cpu_lately(kContendedWindow)) return kPollOn;
    slept_for_still = true;
    return kSleepNow;
  };
  struct EndBeat {  // even again: outside a wait (on every way out, throws included)
    const StillWatch& still;
    std::atomic<uint32_t>& word;
    const uint32_t& beats;
    ~EndBeat() {
      if (still.beat_published()) word.store(beats, std::memory_order_relaxed);
    }
  } end_beat{still, bells_[rank_].beat.value, beats_};
  // Past the polling budget, with this rank kept off its CPU meanwhile: polls on only while every
  // rank waited for comes once it runs again (comes_once_it_runs). One still computing before
  // the op may take long, and the polls would take CPU from whatever runs beside: the wait sleeps.
  auto poll_on = [&] {
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_ || !waiting(r)) continue;
      if (!comes_once_it_runs(slots_[r], bells_[r], op != nullptr ? op->seq : 0)) return false;
    }
    return true;
  };
  WaitOutcome outcome;
  SpinPolicy policy = spin_.policy();
  if (op != nullptr) policy.paced = kPacedPolls;  // a collective's wait (SpinPolicy::paced)
  const bool done = await([&] { return ready() || stopped(op_seq); }, word, sleepers, deadline,
                          policy, keep_spinning, check_peers, &outcome, poll_on);
  // A sleep for ranks that sat still says nothing of the polling budget (AdaptiveSpin).
  if (!slept_for_still) spin_.record(outcome);
  note_cpu();  // where this rank runs until its next wait (a wake-up may have moved it)
  if (aborted_.load()) throw_if_stopped(ctx, op_seq);
  if (ready()) return;
  throw_if_stopped(ctx, op_seq);
  check_peers();
  if (!done) on_timeout();
  throw Error(ErrorCode::kInternal, ctx.description() + ": shm wait ended without its condition");
}

}  // namespace tutti::shm_backend
