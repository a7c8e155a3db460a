#include "util/op_clock.h"

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
// between would misplace it by the preemption): about 1-4 us at 1-4 GHz.
constexpr uint64_t kMaxReadTicks = 4096;

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

bool trusted() {
  static const bool yes = counter_trusted();
  return yes;
}

#if defined(__x86_64__)
struct Anchor {
  uint64_t counter = 0;      // 0: none yet
  int64_t ns = 0;            // the steady clock at `counter`, in ns since its epoch
  double ns_per_tick = 0;    // the rate over the last interval
  uint64_t trust_ticks = 0;  // extrapolate this far past the anchor (0: rate not measured yet)
};

thread_local Anchor anchor;

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<nanoseconds>(t.time_since_epoch()).count();
}

// A real clock read, and a new anchor (with the rate over the interval since the last one) when
// the read was not preempted.
Clock::time_point reanchor() {
  Anchor& a = anchor;
  const uint64_t before = __rdtsc();
  const Clock::time_point real = Clock::now();
  const uint64_t after = __rdtsc();
  if (after - before > kMaxReadTicks) return real;
  const uint64_t counter = before + (after - before) / 2;
  const int64_t ns = ns_of(real);
  const bool forward = a.counter != 0 && counter > a.counter && ns > a.ns;
  if (forward && ns - a.ns >= kAnchorEveryNs / 2) {
    const double rate = static_cast<double>(ns - a.ns) / static_cast<double>(counter - a.counter);
    const bool plausible = rate > 0.05 && rate < 20;  // a counter at 50 MHz-20 GHz
    a.ns_per_tick = plausible ? rate : 0;
    a.trust_ticks = plausible ? static_cast<uint64_t>(kAnchorEveryNs / rate) : 0;
  } else if (forward && a.trust_ticks == 0) {
    return real;  // keep the first anchor until the interval is long enough to measure the rate
  } else {
    // The counter or the clock went back (a VM's migration), or the window ended early (the
    // counter's rate changed): read the clock until a new interval measures the rate.
    a.trust_ticks = 0;
  }
  a.counter = counter;
  a.ns = ns;
  return real;
}
#endif

}  // namespace

bool op_clock_uses_counter() {
  return trusted();
}

Clock::time_point op_now() {
#if defined(__x86_64__)
  if (trusted()) {
    const Anchor& a = anchor;
    const uint64_t ticks = __rdtsc() - a.counter;
    if (ticks < a.trust_ticks) {
      return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
          nanoseconds(a.ns + static_cast<int64_t>(static_cast<double>(ticks) * a.ns_per_tick))));
    }
    return reanchor();
  }
#endif
  return Clock::now();
}

}  // namespace tutti::detail
