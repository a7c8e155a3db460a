// Deadlines that saturate (internal).
//
// `Clock::now() + timeout` overflows for a timeout near its type's maximum
// (std::chrono::milliseconds::max(), the natural way to say "no timeout"): the sum wraps into the
// past and the wait ends at once. deadline_after() clamps at the clock's last time point instead,
// which every wait here treats as "never".
#pragma once

#include <chrono>
#include <ratio>
#include <type_traits>

namespace tutti::detail {

// `now + timeout`, or Clock::time_point::max() when that would not fit. A zero or negative
// timeout gives `now`. Works for any clock and any duration type, including floating ones.
template <typename Clock = std::chrono::steady_clock, typename Rep, typename Period>
typename Clock::time_point deadline_after(std::chrono::duration<Rep, Period> timeout,
                                          typename Clock::time_point now = Clock::now()) {
  using TimePoint = typename Clock::time_point;
  using Duration = typename Clock::duration;
  if (timeout <= timeout.zero()) return now;
  // How far the clock can still go from now. Before the epoch (a negative now) max() - now would
  // overflow; any duration the clock can hold fits there.
  const Duration room =
      now.time_since_epoch() < Duration::zero() ? Duration::max() : TimePoint::max() - now;
  if constexpr (std::is_floating_point_v<Rep>) {
    const auto ticks = std::chrono::duration<long double, typename Duration::period>(timeout);
    if (!(ticks.count() < static_cast<long double>(room.count()))) return TimePoint::max();
    return now + Duration(static_cast<typename Duration::rep>(ticks.count()));
  } else if constexpr (std::ratio_greater_equal<Period, typename Duration::period>::value) {
    // The timeout's unit is coarser: express the room in it (a division, rounding down).
    const auto room_in_units = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(room);
    if (timeout > room_in_units) return TimePoint::max();
    return now + std::chrono::duration_cast<Duration>(timeout);
  } else {
    // The timeout's unit is finer: bring it down to the clock's unit (a division).
    const auto in_clock_units = std::chrono::duration_cast<Duration>(timeout);
    if (in_clock_units > room) return TimePoint::max();
    return now + in_clock_units;
  }
}

// True for a deadline that deadline_after() saturated: the wait has no end.
template <typename TimePoint>
constexpr bool is_unbounded(TimePoint deadline) {
  return deadline == TimePoint::max();
}

// What is left until `deadline`, in whole milliseconds rounded up (so a wait of the result never
// ends before the deadline), zero once it has passed; milliseconds::max() for an unbounded one.
template <typename Clock = std::chrono::steady_clock>
std::chrono::milliseconds time_left(typename Clock::time_point deadline,
                                    typename Clock::time_point now = Clock::now()) {
  if (is_unbounded(deadline)) return std::chrono::milliseconds::max();
  if (deadline <= now) return std::chrono::milliseconds::zero();
  return std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
}

}  // namespace tutti::detail
