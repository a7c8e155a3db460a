// How the shm backend's staged collectives choose their stores (backends/shm/shm_publish.h),
// with times made up here, and the streaming copy they use (util/stream_copy.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "../backends/shm/shm_publish.h"
#include "util/stream_copy.h"

namespace tutti::shm_backend {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Chooser = PublishChooser;
constexpr size_t kMiB = size_t{1} << 20;

// Runs one op of `bytes` on c at `now`, taking `cached` or `streamed` as the pick says; returns
// the pick. now advances by the op's time.
Chooser::Pick run(Chooser& c, size_t bytes, Chooser::Clock::time_point& now, microseconds cached,
                  microseconds streamed, Chooser::Kind kind = Chooser::kReduce) {
  const Chooser::Pick p = c.pick(kind, bytes);
  const microseconds took = p.stream ? streamed : cached;
  now += took;
  c.record(p, took, now);
  return p;
}

TEST(PublishChooser, SmallMessagesAndFixedModesAreNotMeasured) {
  Chooser c;
  EXPECT_EQ(c.pick(Chooser::kReduce, Chooser::kMinBytes - 1).cell, -1);
  EXPECT_FALSE(c.pick(Chooser::kReduce, Chooser::kMinBytes - 1).stream);
  EXPECT_GE(c.pick(Chooser::kReduce, Chooser::kMinBytes).cell, 0);
  Chooser streamed(Chooser::Mode::kStreamed);
  EXPECT_TRUE(streamed.pick(Chooser::kReduce, 64 * kMiB).stream);
  EXPECT_EQ(streamed.pick(Chooser::kReduce, 64 * kMiB).cell, -1);
  Chooser cached(Chooser::Mode::kCached);
  EXPECT_FALSE(cached.pick(Chooser::kReduce, 64 * kMiB).stream);
}

TEST(PublishChooser, TheFirstFourOpsAlternateAndTheFasterBestTimeWins) {
  Chooser c;
  auto now = Chooser::Clock::time_point{} + std::chrono::hours(1);
  std::vector<bool> ways;
  // The first op's page faults make its ordinary time 10x: the best of two counts.
  const Chooser::Pick first = c.pick(Chooser::kReduce, kMiB);
  ways.push_back(first.stream);
  now += microseconds(1000);
  c.record(first, microseconds(1000), now);
  for (int i = 0; i < 3; ++i)
    ways.push_back(run(c, kMiB, now, microseconds(50), microseconds(120)).stream);
  EXPECT_EQ(ways, (std::vector<bool>{false, true, false, true}));
  EXPECT_FALSE(c.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).cached_ns, 50e3);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).streamed_ns, 120e3);
  for (int i = 0; i < 10; ++i)
    EXPECT_FALSE(run(c, kMiB, now, microseconds(50), microseconds(120)).stream);

  // Another size class, another kind: measured on their own.
  Chooser d;
  for (int i = 0; i < 4; ++i) run(d, 4 * kMiB, now, microseconds(2000), microseconds(450));
  EXPECT_TRUE(d.seen(Chooser::kReduce, 4 * kMiB).stream);
  EXPECT_EQ(d.seen(Chooser::kReduce, 8 * kMiB).cached_ns, 0);
  EXPECT_EQ(d.seen(Chooser::kAllgather, 4 * kMiB).cached_ns, 0);
  // 4 MiB and 4 MiB + 1 byte share a class; 8 MiB does not.
  EXPECT_EQ(d.pick(Chooser::kReduce, 4 * kMiB + 1).cell, d.pick(Chooser::kReduce, 4 * kMiB).cell);
  EXPECT_NE(d.pick(Chooser::kReduce, 8 * kMiB).cell, d.pick(Chooser::kReduce, 4 * kMiB).cell);
}

TEST(PublishChooser, TheOtherWayIsTimedAgainOnlyAfterItsIntervalAndTakesOverWhenFaster) {
  Chooser c;
  auto now = Chooser::Clock::time_point{} + std::chrono::hours(1);
  for (int i = 0; i < 4; ++i) run(c, kMiB, now, microseconds(50), microseconds(120));
  // 100 ops' worth of 50 us is 5 ms, under the 200 ms floor: ordinary stores until 200 ms.
  int explored = 0;
  const auto start = now;
  while (now - start < milliseconds(100))
    explored += run(c, kMiB, now, microseconds(50), microseconds(120)).explore;
  EXPECT_EQ(explored, 0);
  // The machine changed: ordinary stores take 500 us now. Counted as at most 4 means each, the
  // mean goes 87.5, 153, 240 us, past 1.5x the other's last time (180 us), so the 4th op (long
  // before 200 ms) times streaming stores: they win.
  int ops = 0;
  Chooser::Pick p;
  do {
    p = run(c, kMiB, now, microseconds(500), microseconds(110));
    ++ops;
  } while (!p.explore && ops < 10);
  EXPECT_TRUE(p.explore);
  EXPECT_TRUE(p.stream);
  EXPECT_EQ(ops, 4);
  EXPECT_TRUE(c.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_FALSE(run(c, kMiB, now, microseconds(500), microseconds(110)).explore);
  // And back: the ordinary stores are timed again after 200 ms (100 x 110 us is 11 ms).
  const auto switched = now;
  do {
    p = run(c, kMiB, now, microseconds(50), microseconds(110));
  } while (!p.explore);
  EXPECT_FALSE(p.stream);
  EXPECT_GE(now - switched, milliseconds(200));
  EXPECT_LT(now - switched, milliseconds(201));
  EXPECT_FALSE(c.seen(Chooser::kReduce, kMiB).stream);
}

TEST(PublishChooser, AnOtherWayNotTenPercentFasterDoesNotTakeOver) {
  Chooser c;
  auto now = Chooser::Clock::time_point{} + std::chrono::hours(1);
  for (int i = 0; i < 4; ++i) run(c, 64 * kMiB, now, microseconds(6500), microseconds(6800));
  ASSERT_FALSE(c.seen(Chooser::kReduce, 64 * kMiB).stream);
  // 100 x 6.5 ms: the other way is timed every 650 ms, and at 6000 us (8% faster) keeps out.
  Chooser::Pick p;
  const auto start = now;
  do {
    p = run(c, 64 * kMiB, now, microseconds(6500), microseconds(6000));
  } while (!p.explore);
  EXPECT_GE(now - start, milliseconds(650));
  EXPECT_LT(now - start, milliseconds(660));
  EXPECT_FALSE(c.seen(Chooser::kReduce, 64 * kMiB).stream);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, 64 * kMiB).streamed_ns, 6000e3);
}

TEST(PublishChooser, OnePreemptedOpCountsAsFourMeans) {
  Chooser c;
  auto now = Chooser::Clock::time_point{} + std::chrono::hours(1);
  for (int i = 0; i < 4; ++i) run(c, kMiB, now, microseconds(50), microseconds(120));
  run(c, kMiB, now, microseconds(100000), microseconds(120));  // 100 ms off the CPU
  // (3 x 50 + 4 x 50) / 4 = 87.5 us: under 1.5 x 120, so no early look at the other way.
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).cached_ns, 87.5e3);
  EXPECT_FALSE(c.pick(Chooser::kReduce, kMiB).explore);
}

TEST(StreamCopy, CopiesEveryLengthAndAlignmentAsMemcpyWould) {
  // Lengths around the streaming threshold and the 64-byte lines, at every offset within a line,
  // into a buffer whose bytes around the target must stay as they were.
  std::vector<uint8_t> src(3 * detail::kStreamCopyMin + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, detail::kStreamCopyMin - 1,
                   detail::kStreamCopyMin, detail::kStreamCopyMin + 1, detail::kStreamCopyMin + 63,
                   2 * detail::kStreamCopyMin + 100}) {
    for (size_t dst_off = 0; dst_off < 64; dst_off += 7) {
      for (size_t src_off : {size_t{0}, size_t{5}, size_t{32}}) {
        std::vector<uint8_t> dst(n + 256, 0xEE);
        detail::stream_copy(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const uint8_t want = i >= dst_off && i < dst_off + n ? src[src_off + i - dst_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "n " << n << ", dst offset " << dst_off << ", src offset "
                                  << src_off << ", byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tutti::shm_backend
