// The Gloo backend's direct exchange (small and mid-size allreduces and barriers over Gloo pairs
// in synchronous mode): chunk boundaries, results identical on every rank, mismatched calls
// failing with the peer named, a silent peer timing out, and the switch that turns it off.
// Ranks as threads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

constexpr size_t kChunk = 32 << 10;  // DirectExchange::kChunkBytes, restated as the spec

// Sizes around the chunk size, in int32 elements, at 2 and 3 ranks (every one of them under
// the direct exchange's default limits): rank r contributes r * 1000 + i at element i.
TEST(GlooDirect, AllreduceAcrossChunkBoundaries) {
  for (int world : {2, 3}) {
    auto groups = create_groups(world, "gloo", unique_name("direct-chunks"));
    const int64_t counts[] = {1, kChunk / 4 - 1, kChunk / 4, kChunk / 4 + 1, 3 * kChunk / 4 + 5};
    run_ranks(world, [&](int r) {
      for (int64_t n : counts) {
        std::vector<int32_t> v(n);
        for (int64_t i = 0; i < n; ++i) v[i] = r * 1000 + static_cast<int32_t>(i);
        groups[r]->allreduce(v);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          // sum over ranks of (rank * 1000 + i)
          const int64_t want = 1000LL * world * (world - 1) / 2 + world * i;
          wrong += v[i] != want;
        }
        EXPECT_EQ(wrong, 0) << "world " << world << ", " << n << " elements, rank " << r;
      }
    });
  }
}

// Float sums whose rounding depends on the order: every rank must still end with the same
// bits, namely those of summing in rank order (the order the backend documents).
TEST(GlooDirect, EveryRankGetsTheSameBits) {
  const int world = 3;
  auto groups = create_groups(world, "gloo", unique_name("direct-bits"));
  const int64_t n = 5000;
  auto value = [](int r, int64_t i) {
    const float big = 1.0e8f;
    const float parts[3] = {big, 3.0f + static_cast<float>(i % 7), -big};
    return parts[(r + i) % 3];
  };
  std::vector<std::vector<float>> out(world);
  run_ranks(world, [&](int r) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = value(r, i);
    groups[r]->allreduce(v);
    out[r] = v;
  });
  for (int64_t i = 0; i < n; ++i) {
    float want = value(0, i);
    for (int r = 1; r < world; ++r) want = want + value(r, i);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(std::memcmp(&out[r][i], &want, sizeof(float)), 0)
          << "element " << i << " on rank " << r << ": " << out[r][i] << ", want " << want;
    }
  }
}

// Two small allreduces of different sizes meet in the direct exchange: each rank's header
// check names the other rank, and the group is aborted.
TEST(GlooDirect, MismatchedSizesFailNamingThePeer) {
  auto groups = create_groups(2, "gloo", unique_name("direct-mismatch"), milliseconds(20000));
  run_ranks(2, [&](int r) {
    std::vector<float> v(r == 0 ? 8 : 9, 1.0f);
    const std::string peer = "rank " + std::to_string(1 - r) + " called a different op or size";
    EXPECT_TUTTI_ERROR(groups[r]->allreduce(v), ErrorCode::kRemoteError, "allreduce #0", peer,
                       "same calls in the same order");
    EXPECT_TRUE(groups[r]->is_aborted());
  });
}

TEST(GlooDirect, ASilentPeerTimesOutNamingIt) {
  auto groups = create_groups(2, "gloo", unique_name("direct-silent"), milliseconds(400));
  std::vector<float> v(4, 1.0f);
  EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kTimeout, "allreduce #0",
                     "timed out after 400 ms", "waiting for rank 1");
  EXPECT_TUTTI_ERROR(groups[0]->barrier(), ErrorCode::kAborted);
}

TEST(GlooDirect, BarrierThenAllreduceStayInStep) {
  auto groups = create_groups(4, "gloo", unique_name("direct-barrier"));
  run_ranks(4, [&](int r) {
    for (int k = 0; k < 20; ++k) {
      groups[r]->barrier();
      std::vector<int64_t> v(3, r + k);
      groups[r]->allreduce(v);
      EXPECT_EQ(v[2], 0 + 1 + 2 + 3 + 4 * k);
    }
  });
}

// TUTTI_GLOO_DIRECT_BYTES=0 sends every allreduce and barrier through Gloo's own functions; the
// results are the same.
TEST(GlooDirect, OffByEnvironmentGivesTheSameResults) {
  ::setenv("TUTTI_GLOO_DIRECT_BYTES", "0", 1);
  auto groups = create_groups(3, "gloo", unique_name("direct-off"));
  ::unsetenv("TUTTI_GLOO_DIRECT_BYTES");
  run_ranks(3, [&](int r) {
    groups[r]->barrier();
    std::vector<int32_t> v(1000, r + 1);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[999], 6);
  });
}

TEST(GlooDirect, ABadLimitIsRefusedNamingIt) {
  ::setenv("TUTTI_GLOO_DIRECT_BYTES", "lots", 1);
  auto store = std::make_shared<HashStore>(milliseconds(5000));
  const std::string name = unique_name("direct-bad");
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    GroupOptions options;
    options.store = store;
    options.timeout = milliseconds(5000);
    try {
      CollectiveGroup::create(2, r, "gloo", name, options);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  ::unsetenv("TUTTI_GLOO_DIRECT_BYTES");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("TUTTI_GLOO_DIRECT_BYTES must be a byte count, not 'lots'"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

}  // namespace
}  // namespace tutti::testing
