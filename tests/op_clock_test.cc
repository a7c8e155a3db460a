// The ops' clock (src/util/op_clock.h): op_now() stays within about a microsecond of the steady
// clock, across the anchors each thread takes, in tight loops and after pauses.
#include "util/op_clock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace tutti::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::nanoseconds;

// How far op_now() may stray outside the steady clock's reads around it: the anchors' error
// (half a 1024-tick read window and the rate it misjudges over 1 ms: under 2 us at 2 GHz).
constexpr auto kSlack = microseconds(8);

// Reads op_now() between two steady reads `reads` times, for at least `span`; returns the worst
// distance outside the bracket, in ns (0 when always inside).
int64_t worst_outside(int reads, Clock::duration span) {
  int64_t worst = 0;
  const auto until = Clock::now() + span;
  for (int i = 0; i < reads || Clock::now() < until; ++i) {
    const auto before = Clock::now();
    const auto t = op_now();
    const auto after = Clock::now();
    if (t < before) worst = std::max<int64_t>(worst, nanoseconds(before - t).count());
    if (t > after) worst = std::max<int64_t>(worst, nanoseconds(t - after).count());
  }
  return worst;
}

// Where op_now() is the steady clock itself there is nothing to check.
#define SKIP_WITHOUT_THE_COUNTER()                                                       \
  if (!op_clock_uses_counter()) {                                                        \
    GTEST_SKIP() << "op_now() is steady_clock::now() here (the kernel's clocksource is " \
                    "not tsc, or not x86-64)";                                           \
  }

TEST(OpClock, ANewThreadExtrapolatesSoon) {
  SKIP_WITHOUT_THE_COUNTER();
  // Its first anchor trusts the process's rate (or, where that could not be measured, its own
  // after half a millisecond): the common path, not a clock read each time.
  bool extrapolates = false;
  std::thread([&] {
    const auto until = Clock::now() + std::chrono::milliseconds(50);
    while (!extrapolates && Clock::now() < until) {
      op_now();
      extrapolates = op_clock_extrapolates();
    }
  }).join();
  EXPECT_TRUE(extrapolates);
}

TEST(OpClock, AMisjudgedProcessRateIsReplaced) {
  SKIP_WITHOUT_THE_COUNTER();
  const double good = op_clock_process_rate();
  if (good <= 0) GTEST_SKIP() << "the process's rate could not be measured here";
  // 3% off: every thread's measured rate is refused against it. Eight refused intervals in a row
  // that agree (0.5-1 ms each) replace it, and threads extrapolate again.
  op_clock_set_process_rate(good * 1.03);
  bool extrapolates = false;
  int64_t worst = 0;
  std::thread([&] {
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (Clock::now() < until && op_clock_process_rate() > good * 1.01) op_now();
    worst_outside(1000, std::chrono::milliseconds(3));  // a fresh anchor at the new rate
    worst = worst_outside(20000, std::chrono::milliseconds(5));
    extrapolates = op_clock_extrapolates();
  }).join();
  const double now = op_clock_process_rate();
  op_clock_set_process_rate(good);
  EXPECT_GT(now, good * 0.99);
  EXPECT_LT(now, good * 1.01);
  EXPECT_TRUE(extrapolates);
  EXPECT_LE(worst, nanoseconds(kSlack).count());
}

TEST(OpClock, StaysWithTheSteadyClockInATightLoop) {
  SKIP_WITHOUT_THE_COUNTER();
  // 30 ms of reads: some thirty anchors and rates, each extrapolated across its window.
  const int64_t worst = worst_outside(100000, std::chrono::milliseconds(30));
  std::printf("farthest outside the steady reads around it: %lld ns\n",
              static_cast<long long>(worst));
  EXPECT_LE(worst, nanoseconds(kSlack).count());
}

TEST(OpClock, StaysWithTheSteadyClockAcrossPauses) {
  SKIP_WITHOUT_THE_COUNTER();
  // Pauses longer than a window, shorter than one and about one: each read after a pause either
  // re-anchors or extrapolates across the pause.
  int64_t worst = 0;
  for (const int us : {50, 300, 700, 1000, 1500, 5000, 20000}) {
    for (int rep = 0; rep < 3; ++rep) {
      std::this_thread::sleep_for(microseconds(us));
      worst = std::max(worst, worst_outside(1, Clock::duration::zero()));
      worst = std::max(worst, worst_outside(2000, Clock::duration::zero()));
    }
  }
  EXPECT_LE(worst, nanoseconds(kSlack).count());
}

TEST(OpClock, EachThreadKeepsItsOwnAnchor) {
  SKIP_WITHOUT_THE_COUNTER();
  std::vector<int64_t> worst(4, 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < worst.size(); ++i) {
    threads.emplace_back(
        [&worst, i] { worst[i] = worst_outside(20000, std::chrono::milliseconds(10)); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < worst.size(); ++i) {
    EXPECT_LE(worst[i], nanoseconds(kSlack).count()) << "thread " << i;
  }
}

}  // namespace
}  // namespace tutti::detail
