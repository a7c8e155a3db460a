// The NCCL backend's pieces that need no GPU: type and op mapping, device-list keys, rank
// arithmetic, registration and availability.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "nccl_types.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using namespace tutti::nccl_backend;

TEST(NcclMapping, EveryDtypeHasAnNcclType) {
  EXPECT_EQ(to_nccl(DType::kBool), ncclUint8);
  EXPECT_EQ(to_nccl(DType::kInt8), ncclInt8);
  EXPECT_EQ(to_nccl(DType::kUInt8), ncclUint8);
  EXPECT_EQ(to_nccl(DType::kInt32), ncclInt32);
  EXPECT_EQ(to_nccl(DType::kUInt32), ncclUint32);
  EXPECT_EQ(to_nccl(DType::kInt64), ncclInt64);
  EXPECT_EQ(to_nccl(DType::kUInt64), ncclUint64);
  EXPECT_EQ(to_nccl(DType::kFloat16), ncclFloat16);
  EXPECT_EQ(to_nccl(DType::kBFloat16), ncclBfloat16);
  EXPECT_EQ(to_nccl(DType::kFloat32), ncclFloat32);
  EXPECT_EQ(to_nccl(DType::kFloat64), ncclFloat64);
}

TEST(NcclMapping, ReduceOps) {
  EXPECT_EQ(to_nccl(ReduceOp::kSum, DType::kFloat32), ncclSum);
  EXPECT_EQ(to_nccl(ReduceOp::kProduct, DType::kInt64), ncclProd);
  EXPECT_EQ(to_nccl(ReduceOp::kMin, DType::kBFloat16), ncclMin);
  EXPECT_EQ(to_nccl(ReduceOp::kMax, DType::kUInt8), ncclMax);
  EXPECT_EQ(to_nccl(ReduceOp::kAvg, DType::kFloat16), ncclAvg);
  // bool travels as 0/1 bytes: or is max, and is min.
  EXPECT_EQ(to_nccl(ReduceOp::kSum, DType::kBool), ncclMax);
  EXPECT_EQ(to_nccl(ReduceOp::kMax, DType::kBool), ncclMax);
  EXPECT_EQ(to_nccl(ReduceOp::kProduct, DType::kBool), ncclMin);
  EXPECT_EQ(to_nccl(ReduceOp::kMin, DType::kBool), ncclMin);
}

TEST(NcclMapping, DeviceListKeysAndRanks) {
  float x[4];
  std::vector<TensorView> list = {TensorView(x, DType::kFloat32, {4}, Device::cuda(0)),
                                  TensorView(x, DType::kFloat32, {4}, Device::cuda(1)),
                                  TensorView(x, DType::kFloat32, {4}, Device::cuda(3))};
  EXPECT_EQ(device_list_key(list), "0,1,3");
  EXPECT_EQ(device_list_key({list[2]}), "3");
  // Ray's arithmetic: rank 2 of a job whose processes drive 3 GPUs each, its second GPU.
  EXPECT_EQ(nccl_rank(2, 3, 1), 7);
  EXPECT_EQ(nccl_rank(0, 1, 0), 0);
  EXPECT_EQ(nccl_rank(5, 1, 0), 5);
}

bool gpu_visible() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

bool nccl_loads() {
  const char* env = std::getenv("TUTTI_NCCL_LIBRARY");
  void* h = ::dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW);
  return h != nullptr;
}

TEST(NcclBackend, RegisteredByLinkingAndAvailableOnlyWithAGpuAndNccl) {
  EXPECT_TRUE(is_registered_collective_backend("nccl"));
  EXPECT_EQ(is_backend_available("nccl"), gpu_visible() && nccl_loads());
}

TEST(NcclBackend, WithoutAGpuAGroupFailsClearly) {
  if (gpu_visible() && nccl_loads()) GTEST_SKIP() << "a GPU is present: see the gpu-labelled tests";
  try {
    CollectiveGroup::create(1, 0, "nccl", unique_name("nogpu"));
    ADD_FAILURE() << "an NCCL group was created without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no CUDA device") != std::string::npos ||
                what.find("cannot load") != std::string::npos)
        << what;
    EXPECT_NE(what.find("backend 'nccl'"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tutti::testing
