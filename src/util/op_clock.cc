#include "util/op_clock.h"

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tutti::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

// How long a thread extrapolates from one anchor; the rate is measured over the same interval.
constexpr int64_t kAnchorEveryNs = 1000000;
// An anchor's clock read must sit between two counter reads this close (a read preempted in
// between would misplace it by the preemption): about 0.25-1 us at 1-4 GHz.
constexpr uint64_t kMaxReadTicks = 1024;
// A thread's rate is refused (and the clock read until the next interval) when it strays this
// far from the process's: a suspend (the steady clock stops, the counter does not), a slewed
// clock's step, a counter whose rate changed.
constexpr double kRateTolerance = 0.01;
// Refused this many intervals in a row, each within the tolerance of the first, a thread's
// rate replaces the process's: that one was misjudged (a 200 us measurement gone wrong), not
// the intervals. Without it every thread would read the clock on every op from then on.
constexpr int kRefusalsToAdopt = 8;

bool counter_trusted() {
#if defined(__x86_64__)
  // The kernel keeps its own clock on the counter only where it found it invariant and in step
  // across CPUs (and on VMs, stable); otherwise it falls back to hpet, acpi_pm or kvm-clock.
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(source >> name) && name == "tsc";
#else
  return false;
#endif
}

#if defined(__x86_64__)
int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<nanoseconds>(t.time_since_epoch()).count();
}

// A clock read and the counter at it; `spread`: the ticks between the counter reads around it.
struct Reading {
  uint64_t counter;
  int64_t ns;
  Clock::time_point real;
  uint64_t spread;
};

Reading read_both() {
  const uint64_t before = __rdtsc();
  const Clock::time_point real = Clock::now();
  const uint64_t after = __rdtsc();
  return {before + (after - before) / 2, ns_of(real), real, after - before};
}

// ns per tick from two readings, or 0 when implausible (a counter outside 50 MHz-20 GHz).
double rate_between(const Reading& a, const Reading& b) {
  if (b.counter <= a.counter || b.ns <= a.ns) return 0;
  const double rate = static_cast<double>(b.ns - a.ns) / static_cast<double>(b.counter - a.counter);
  return rate > 0.05 && rate < 20 ? rate : 0;
}

// The rate every thread starts from, measured once per process over 200 us between two readings
// taken within 256 ticks each (~0.1 us): off by under 0.1%, so under 1 us over a window. 0 where
// five tries were all preempted (threads then measure their own before extrapolating).
double measure_process_rate() {
  constexpr uint64_t kTightTicks = 256;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const Reading a = read_both();
    if (a.spread > kTightTicks) continue;
    while (Clock::now() - a.real < std::chrono::microseconds(200)) {
    }
    const Reading b = read_both();
    if (b.spread > kTightTicks) continue;
    const double rate = rate_between(a, b);
    if (rate > 0) return rate;
  }
  return 0;
}
#endif

// What the process uses, decided once: 0 not yet, 1 the counter (at g_rate, 0 where it could
// not be measured: each thread measures its own), 2 the steady clock. No guarded static: a
// fork() while another thread measured would leave the child's next group waiting on the guard
// forever. Threads that race here each measure; either answer serves.
std::atomic<int> g_mode{0};
std::atomic<double> g_rate{0};

[[gnu::noinline]] int decide() {
  int mode = 2;
  double rate = 0;
  if (counter_trusted()) {
    mode = 1;
#if defined(__x86_64__)
    rate = measure_process_rate();
#endif
  }
  // A racer whose measurement failed (0) never overwrites one that succeeded.
  double none = 0;
  if (rate > 0) g_rate.compare_exchange_strong(none, rate, std::memory_order_relaxed);
  g_mode.store(mode, std::memory_order_release);
  return mode;
}

inline bool counter_mode() {
  const int mode = g_mode.load(std::memory_order_acquire);
  return (mode != 0 ? mode : decide()) == 1;
}

#if defined(__x86_64__)
struct Anchor {
  uint64_t counter = 0;      // 0: none yet
  int64_t ns = 0;            // the steady clock at `counter`, in ns since its epoch
  double ns_per_tick = 0;    // the rate over the last interval
  uint64_t trust_ticks = 0;  // extrapolate this far past the anchor (0: no rate to trust)
  double refused_rate = 0;   // the first rate of a run of refusals, and how many agreed with it
  int refusals = 0;
};

bool within_tolerance(double rate, double of) {
  return rate > of * (1 - kRateTolerance) && rate < of * (1 + kRateTolerance);
}

thread_local Anchor anchor;

void trust(Anchor& a, double ns_per_tick) {
  a.ns_per_tick = ns_per_tick;
  a.trust_ticks = ns_per_tick > 0
                      ? static_cast<uint64_t>(static_cast<double>(kAnchorEveryNs) / ns_per_tick)
                      : 0;
}

// A real clock read, and a new anchor (with the rate over the interval since the last one) when
// the read was not preempted. Out of line: op_now()'s common path stays a few instructions.
[[gnu::noinline]] Clock::time_point reanchor(Anchor& a) {
  const Reading now = read_both();
  if (now.spread > kMaxReadTicks) return now.real;
  const Reading last{a.counter, a.ns, {}, 0};
  const bool forward = a.counter != 0 && now.counter > a.counter && now.ns > a.ns;
  const double process_rate = g_rate.load(std::memory_order_relaxed);
  if (a.counter == 0) {
    trust(a, process_rate);  // a thread's first anchor: the process's rate
  } else if (forward && now.ns - a.ns >= kAnchorEveryNs / 2) {
    const double rate = rate_between(last, now);
    // A refusal that agrees with the first of the run (so that the run cannot drift from it).
    const bool again = rate > 0 && a.refusals > 0 && within_tolerance(rate, a.refused_rate);
    if (process_rate <= 0 || within_tolerance(rate, process_rate)) {
      a.refusals = 0;
      trust(a, rate);
    } else if (again && a.refusals + 1 >= kRefusalsToAdopt) {
      g_rate.store(rate, std::memory_order_relaxed);
      a.refusals = 0;
      trust(a, rate);
    } else {
      if (!again) a.refused_rate = rate;
      a.refusals = rate > 0 ? (again ? a.refusals + 1 : 1) : 0;
      trust(a, 0);
    }
  } else if (forward && a.trust_ticks == 0) {
    return now.real;  // keep the anchor until the interval is long enough to measure the rate
  } else {
    // The counter or the clock went back (a VM's migration), or the window ended early (the
    // counter's rate changed): read the clock until a new interval measures the rate.
    trust(a, 0);
  }
  a.counter = now.counter;
  a.ns = now.ns;
  return now.real;
}
#endif

}  // namespace

bool op_clock_uses_counter() {
  return counter_mode();
}

double op_clock_process_rate() {
  counter_mode();
  return g_rate.load(std::memory_order_relaxed);
}

void op_clock_set_process_rate(double ns_per_tick) {
  counter_mode();
  g_rate.store(ns_per_tick, std::memory_order_relaxed);
}

bool op_clock_extrapolates() {
#if defined(__x86_64__)
  return counter_mode() && anchor.trust_ticks != 0;
#else
  return false;
#endif
}

Clock::time_point op_now() {
#if defined(__x86_64__)
  if (counter_mode()) {
    Anchor& a = anchor;
    const Anchor now = a;  // (one thread-local lookup)
    const uint64_t ticks = __rdtsc() - now.counter;
    if (ticks < now.trust_ticks) {  // (so ticks fits an int64_t)
      const double ns = static_cast<double>(static_cast<int64_t>(ticks)) * now.ns_per_tick;
      return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
          nanoseconds(now.ns + static_cast<int64_t>(ns))));
    }
    return reanchor(a);
  }
#endif
  return Clock::now();
}

}  // namespace tutti::detail
