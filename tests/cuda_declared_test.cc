// tutti's declared CUDA and NCCL headers (backends/cuda/declared/), which the NCCL backend and
// cuda_ipc build against where the toolkit is absent, against the toolkit's own: every value,
// size and offset they state must be the toolkit's.
#include <gtest/gtest.h>

#include <map>

#include "cuda_layout.h"

namespace {

TEST(CudaDeclared, MatchesTheToolkit) {
  const CudaLayout toolkit = cuda_layout_toolkit(false);
  const CudaLayout declared = cuda_layout_declared(false);
  ASSERT_EQ(toolkit.size(), declared.size());
  ASSERT_GT(toolkit.size(), 90u);
  for (size_t i = 0; i < toolkit.size(); ++i) {
    EXPECT_EQ(declared[i].second, toolkit[i].second) << toolkit[i].first;
  }
}

TEST(CudaDeclared, BuffersAreLargeEnough) {
  const CudaLayout toolkit = cuda_layout_toolkit(true);
  const CudaLayout declared = cuda_layout_declared(true);
  ASSERT_EQ(toolkit.size(), declared.size());
  for (size_t i = 0; i < toolkit.size(); ++i) {
    EXPECT_GE(declared[i].second, toolkit[i].second) << toolkit[i].first;
  }
}

}  // namespace
