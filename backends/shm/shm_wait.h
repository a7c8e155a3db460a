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

inline void cpu_relax() {
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
  int spins = 0;   // busy iterations with a pause: worth it while every rank has a core
  int yields = 0;  // then iterations that give the core to any other runnable thread
};

// Waits until ready() holds; false when the deadline passed first.
template <typename Ready, typename OnNap>
bool await(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
           Clock::time_point deadline, SpinPolicy policy, OnNap on_nap) {
  for (int i = 0; i < policy.spins; ++i) {
    if (ready()) return true;
    cpu_relax();
  }
  for (int i = 0; i < policy.yields; ++i) {
    if (ready()) return true;
    sched_yield();
  }
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
