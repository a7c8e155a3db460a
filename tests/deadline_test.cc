// Saturating deadlines (src/util/deadline.h): a timeout too long for the clock means "never".
#include "util/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <limits>

namespace tutti::detail {
namespace {

using namespace std::chrono;
using SteadyPoint = steady_clock::time_point;

TEST(DeadlineAfter, OrdinaryTimeoutsAddUp) {
  const SteadyPoint now(seconds(1000));
  EXPECT_EQ(deadline_after(milliseconds(250), now), now + milliseconds(250));
  EXPECT_EQ(deadline_after(microseconds(7), now), now + microseconds(7));
  EXPECT_EQ(deadline_after(hours(24), now), now + hours(24));
  EXPECT_EQ(deadline_after(duration<double>(1.5), now), now + milliseconds(1500));
}

TEST(DeadlineAfter, ZeroAndNegativeTimeoutsAreNow) {
  const SteadyPoint now(seconds(5));
  EXPECT_EQ(deadline_after(milliseconds(0), now), now);
  EXPECT_EQ(deadline_after(milliseconds(-10), now), now);
}

TEST(DeadlineAfter, HugeTimeoutsSaturate) {
  const SteadyPoint now = steady_clock::now();
  EXPECT_EQ(deadline_after(milliseconds::max(), now), SteadyPoint::max());
  EXPECT_EQ(deadline_after(seconds::max(), now), SteadyPoint::max());
  EXPECT_EQ(deadline_after(hours::max(), now), SteadyPoint::max());
  EXPECT_EQ(deadline_after(nanoseconds::max(), now), SteadyPoint::max());
  EXPECT_EQ(deadline_after(duration<double>(std::numeric_limits<double>::infinity()), now),
            SteadyPoint::max());
  EXPECT_EQ(deadline_after(milliseconds::max() / 2, now), SteadyPoint::max());
  EXPECT_TRUE(is_unbounded(deadline_after(milliseconds::max(), now)));
  // Just inside the clock's range still adds exactly.
  const auto room = SteadyPoint::max() - now;
  EXPECT_EQ(deadline_after(room, now), SteadyPoint::max());
  EXPECT_EQ(deadline_after(room - nanoseconds(1), now), SteadyPoint::max() - nanoseconds(1));
  // A deadline past a deadline (a grace period after a wait's own) saturates too.
  EXPECT_EQ(deadline_after(seconds(5), SteadyPoint::max()), SteadyPoint::max());
}

TEST(DeadlineAfter, OtherClocksAndTimesBeforeTheEpoch) {
  const system_clock::time_point before_epoch(-hours(1));
  EXPECT_EQ(deadline_after<system_clock>(hours(2), before_epoch),
            system_clock::time_point(hours(1)));
  EXPECT_EQ(deadline_after<system_clock>(milliseconds::max(), system_clock::now()),
            system_clock::time_point::max());
}

TEST(TimeLeft, RoundsUpAndSaturates) {
  const SteadyPoint now(seconds(100));
  EXPECT_EQ(time_left(now + microseconds(1500), now), milliseconds(2));
  EXPECT_EQ(time_left(now - seconds(1), now), milliseconds(0));
  EXPECT_EQ(time_left(SteadyPoint::max(), now), milliseconds::max());
}

}  // namespace
}  // namespace tutti::detail
