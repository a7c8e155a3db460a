// Messages over 2 GiB (ctest label "large"; needs ~10 GiB of memory and a few minutes).
#include <gtest/gtest.h>

#include "test_util.h"

namespace tutti::testing {
namespace {

// 2^29 + 1000 float32 elements: 2 GiB + 4000 bytes per rank.
constexpr int64_t kCount = (int64_t(1) << 29) + 1000;

class Large : public ::testing::TestWithParam<std::string> {};

TEST_P(Large, AllreduceAndBroadcastOver2GiB) {
  auto groups = create_groups(2, GetParam(), unique_name("large"), std::chrono::minutes(5));
  run_ranks(2, [&](int r) {
    std::vector<float> v(kCount);
    for (int64_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((i + r) % 4);
    groups[r]->allreduce(v);
    for (int64_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>((i % 4) + ((i + 1) % 4));
      if (v[i] != want) {
        ADD_FAILURE() << "allreduce rank " << r << " element " << i << " is " << v[i]
                      << ", expected " << want;
        break;
      }
    }
    for (int64_t i = 0; i < kCount; ++i) v[i] = r == 1 ? static_cast<float>(i % 1000) : -1.0f;
    BroadcastOptions b;
    b.root_rank = 1;
    groups[r]->broadcast(v, b);
    for (int64_t i = kCount - 5000; i < kCount; ++i) {
      ASSERT_EQ(v[i], static_cast<float>(i % 1000)) << "broadcast rank " << r << " element " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, Large, ::testing::Values("gloo", "shm"));

}  // namespace
}  // namespace tutti::testing
