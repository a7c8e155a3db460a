// Waiting on a word in shared memory: spin briefly, then sleep in the kernel (futex) until the
// word changes or a deadline passes (internal to the shm backend).
//
// Protocol: a waker changes the state, then bumps `word` and calls wake() only when `sleepers`
// says someone may be asleep, so the fast path makes no system call. All accesses are
// sequentially consistent, so a waiter either sees the new state or is counted in `sleepers`
// before the waker looks. A sleep never lasts longer than kMaxNap: after each one the waiter's
// on_nap() runs (liveness checks; it may throw), and a wake that carries no change of the word
// (an abort) is seen within that time.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace tutti::shm_backend {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kMaxNap{10};

// How long a wait polls before it yields and sleeps while every rank has a core: longer than a
// scheduler tick (4 ms at HZ=250), because a rank that gives its CPU away to another process gets
// it back only at that process's next tick or slice (shm_backend.cc says why). At least
// kMinSpins polls also where the clock is slow to advance.
constexpr std::chrono::microseconds kLongSpin{5000};
constexpr int kMinSpins = 2000;

// How long in all a wait goes on polling, one budget after another, while the waiter keeps losing
// its CPU as it polls (SpinPolicy::contended_for). Such a waiter's CPU has other work (a build
// beside the job): asleep, it would get the CPU back only after that work's slice, and so would
// its peer at the next wait, one slice per wait. Measured 2026-12-06, 2 ranks beside a loop of
// 4-job builds on 2 vCPUs, Linux 6.18, 6 rounds: with these polls (collectives and
// point-to-point) 2 MiB allreduce 311-441 us and 16 MiB 11.2-12.6 ms in every round; without
// them 16 MiB took 40-161 ms in 3 of 6; Open MPI 330-489 us and 12-36 ms (docs/PERFORMANCE.md).
constexpr std::chrono::milliseconds kContendedSpin{100};
// A gap between two of the polls' clock reads (256 polls apart, microseconds) longer than this
// means the waiter was off its CPU meanwhile (preempted, or its vCPU descheduled).
constexpr std::chrono::microseconds kOffCpuGap{250};

// How many of a collective's first polls are paced by a spin-wait hint each (SpinPolicy::paced;
// shm_backend.cc's exchange() says what that bought).
constexpr int kPacedPolls = 8;

// The processor's spin-wait hint: x86 `pause` (~25 ns on the EPYC VMs measured here, ~40 ns on
// recent Intel cores), Arm's `yield`; elsewhere nothing.
inline void spin_hint() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline uint32_t* futex_address(std::atomic<uint32_t>& word) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                    std::atomic<uint32_t>::is_always_lock_free,
                "futex words must be plain lock-free 32-bit atomics");
  return reinterpret_cast<uint32_t*>(&word);
}

// Wakes every process sleeping on `word` (shared futex: the word lives in a shared mapping).
inline void wake_always(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, futex_address(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Wakes the sleepers on `word`, if `sleepers` says there may be some.
inline void wake_all(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers) {
  if (sleepers.load() != 0) wake_always(word);
}

// How long to busy-wait before sleeping.
struct SpinPolicy {
  // Polls of the condition, worth it while every rank has a core. No pause instruction between
  // them (past a collective's first `paced`): with a CPU-bound process beside 2 ranks on 2 cores,
  // an 8-byte allreduce took ~70 us with 2000 pauses (~50 us of spinning) and ~10 us with 2000 bare
  // polls (~2 us) before the yields: a rank that spins long holds up a peer queued on its core.
  // (Spinning 50 us by the clock without pauses was as bad: ~105 us.)
  int spins = 0;
  int yields = 0;  // then iterations that give the core to any other runnable thread
  // Polls go on past `spins` until this long has passed since the first (0: `spins` only). The
  // clock is read every 256 polls.
  Clock::duration spin_for{};
  // Then another spin_for, and another, while the waiter was off its CPU during the last one (a
  // gap of over off_cpu_gap between clock reads) and await's poll_on() agrees, up to this long
  // since the first clock read (0: never; kContendedSpin says why).
  Clock::duration contended_for{};
  Clock::duration off_cpu_gap = kOffCpuGap;
  // The first this many polls are paced by a spin-wait hint each: a collective's (its small
  // exchange and its barriers), whose peers publish at about the same moment as the waiter; not a
  // point-to-point wait, where a receiver polls for data already on its way (pacing slowed an
  // 8 B-1 KiB ping-pong ~3%). The barriers of the larger sizes were even with it (8 KiB-2 MiB).
  int paced = 0;
};

// How a wait ended, for AdaptiveSpin.
struct WaitOutcome {
  bool slept = false;        // the spins and yields ran out and the waiter slept
  Clock::duration asleep{};  // how long it slept, all naps together
};

// The spin budget, adapted to what the waits show (one per backend; the group calls one op at
// a time, so no two waits update it at once).
//
// Why: a fixed budget locks a pair of ranks into sleeping on every call once a CPU-bound process
// shares their cores. A rank preempted for a moment makes its peer outwait the budget and
// sleep; the peer's wake-up then takes tens of microseconds, which outlasts the first rank's
// budget, which sleeps in turn, and so on at every call (0.4 us -> ~100 us per 8-byte
// allreduce at 2 ranks beside one busy process on 2 cores). So a wait that slept only briefly
// (the peer came soon after: spinning a little longer would have caught it) doubles the budget,
// up to kMaxScale times the base; a wait that slept long (the peer was busy elsewhere, where
// spinning only burns the core) halves it, and waits that end while spinning let it decay
// slowly back to the base.
class AdaptiveSpin {
 public:
  static constexpr std::chrono::microseconds kShortSleep{200};

  AdaptiveSpin() = default;
  // max_scale: the most the budget grows to, as a multiple of `base` (1: fixed).
  AdaptiveSpin(SpinPolicy base, int max_scale) : base_(base), max_scale_(std::max(1, max_scale)) {}

  SpinPolicy policy() const {
    return SpinPolicy{static_cast<int>(scaled(base_.spins)),
                      static_cast<int>(scaled(base_.yields)),
                      base_.spin_for * sixteenths_ / 16,
                      base_.contended_for,
                      base_.off_cpu_gap,
                      base_.paced};
  }
  void record(const WaitOutcome& w) {
    if (max_scale_ == 1) return;
    if (!w.slept) {
      // Decay by 1/16 of the way to the base.
      sixteenths_ = std::max(16, sixteenths_ - std::max(1, (sixteenths_ - 16) / 16));
    } else if (w.asleep < kShortSleep) {
      sixteenths_ = std::min(16 * max_scale_, sixteenths_ * 2);
    } else {
      sixteenths_ = std::max(16, sixteenths_ / 2);
    }
  }
  int scale_sixteenths() const { return sixteenths_; }

 private:
  int64_t scaled(int64_t n) const { return n * sixteenths_ / 16; }

  SpinPolicy base_;
  int max_scale_ = 1;
  int sixteenths_ = 16;  // the budget is base * sixteenths_ / 16
};

// Polls on past a spent budget wherever the waiter lost its CPU meanwhile (await's default).
struct PollOnWhenOffCpu {
  bool operator()() const { return true; }
};

// What keep_spinning() answers await() (a bool converts: true polls on, false stops).
constexpr int kPollOn = 1;
constexpr int kStopPolling = 0;  // then yields, then sleeps
constexpr int kSleepNow = -1;    // sleeps at once, without the yields

// Waits until ready() holds; false when the deadline passed first. The polls stop early once
// keep_spinning() (asked every 256 polls) says no (kSleepNow: and the yields are left out too,
// so that the waiter sleeps until it is woken). on_nap() runs after each sleep, and between
// the budgets of a contended spin, which go on only while poll_on() (asked at each budget's end
// where the waiter was off its CPU) agrees. `outcome`, when given, says whether the wait slept
// and for how long.
template <typename Ready, typename KeepSpinning, typename OnNap, typename PollOn = PollOnWhenOffCpu>
bool await(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
           Clock::time_point deadline, SpinPolicy policy, KeepSpinning keep_spinning, OnNap on_nap,
           WaitOutcome* outcome = nullptr, PollOn poll_on = {}) {
  if (policy.spins > 0 || policy.spin_for.count() > 0) {
    // The clock is first read after 256 polls (or `spins`): most waits end sooner, and a clock
    // read at the start of each would be on every op's critical path. Never past the wait's own
    // deadline (an op's short timeout ends it on time).
    Clock::time_point spin_until{};
    Clock::time_point contended_until{};
    Clock::time_point last_read{};
    bool off_cpu = false;  // during this budget
    for (int64_t i = 0;; ++i) {
      if (ready()) return true;
      if (i < policy.paced) spin_hint();
      if ((i & 255) != 255) continue;
      const int keep = keep_spinning();
      if (keep == kSleepNow) policy.yields = 0;
      if (keep <= kStopPolling) break;
      if (i + 1 < policy.spins || policy.spin_for.count() <= 0) {
        if (i + 1 >= policy.spins) break;
        continue;
      }
      const Clock::time_point now = Clock::now();
      if (spin_until == Clock::time_point{}) {
        spin_until = std::min(deadline, now + policy.spin_for);
        contended_until = std::min(deadline, now + policy.contended_for);
      } else if (now - last_read > policy.off_cpu_gap) {
        off_cpu = true;
      }
      last_read = now;
      if (now < spin_until) continue;
      // The budget is spent. Off its CPU meanwhile: polls on for another, after the checks a
      // sleep would have made (a dead peer).
      if (off_cpu && now < contended_until && poll_on()) {
        off_cpu = false;
        on_nap();
        if (ready()) return true;
        spin_until = std::min(contended_until, now + policy.spin_for);
        continue;
      }
      break;
    }
  }
  for (int i = 0; i < policy.yields; ++i) {
    if (ready()) return true;
    sched_yield();
  }
  const auto sleep_start = Clock::now();
  struct Report {
    WaitOutcome* out;
    Clock::time_point start;
    ~Report() {
      if (out != nullptr) {
        out->slept = true;
        out->asleep = Clock::now() - start;
      }
    }
  } report{outcome, sleep_start};
  while (true) {
    if (ready()) return true;
    sleepers.fetch_add(1);
    const uint32_t seen = word.load();
    if (ready()) {
      sleepers.fetch_sub(1);
      return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      sleepers.fetch_sub(1);
      return ready();
    }
    const auto left = std::min<Clock::duration>(deadline - now, kMaxNap);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::syscall(SYS_futex, futex_address(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
    sleepers.fetch_sub(1);
    if (ready()) return true;
    on_nap();
  }
}

}  // namespace tutti::shm_backend
