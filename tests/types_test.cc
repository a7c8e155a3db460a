// dtypes, conversions, TensorView and DLPack.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "reference.h"
#include "test_util.h"
#include "tutti/dlpack.h"

namespace tutti::testing {
namespace {

TEST(Types, Sizes) {
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kUInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_of<float>(), DType::kFloat32);
  EXPECT_EQ(dtype_of<long long>(), DType::kInt64);
  EXPECT_EQ(dtype_of<BFloat16>(), DType::kBFloat16);
}

TEST(Types, ParseNames) {
  EXPECT_EQ(parse_dtype("fp16"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("BFloat16"), DType::kBFloat16);
  EXPECT_EQ(parse_reduce_op("prod"), ReduceOp::kProduct);
  EXPECT_TUTTI_ERROR(parse_dtype("float128"), ErrorCode::kInvalidArgument, "float128");
  EXPECT_TUTTI_ERROR(parse_reduce_op("xor"), ErrorCode::kInvalidArgument, "xor");
}

// Every float16 bit pattern converts to float as the compiler's _Float16 does, and every float
// that is a float16 value converts back to the same bits.
TEST(Types, Float16MatchesCompiler) {
#if !defined(__FLT16_MAX__)
  GTEST_SKIP() << "this compiler has no _Float16 to check against (clang < 15 on x86-64); the "
                  "GCC build runs it";
#else
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    _Float16 h;
    std::memcpy(&h, &b, 2);
    const float want = static_cast<float>(h);
    const float got = to_float(Float16{b});
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
      continue;
    }
    ASSERT_EQ(got, want) << "bits " << bits;
    ASSERT_EQ(to_float16(want).bits, b) << "bits " << bits;
  }
  // Rounding of values between float16 values, against the compiler's conversion.
  for (float f : {1.0f + 1.0f / 4096, 1.0f + 3.0f / 4096, 65519.0f, 65520.0f, 1e-8f, 3e-8f,
                  -2.5e-5f, 70000.0f, 5.96e-8f, 2.98e-8f, 2.99e-8f}) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    EXPECT_EQ(to_float16(f).bits, want) << f;
  }
#endif
}

TEST(Types, BFloat16RoundsToNearestEven) {
  for (float f : {1.0f, 1.00390625f, 1.005859375f, 3.14159f, -2.71828f, 1e30f, 1e-30f, 0.0f}) {
    const double want = round_to_bfloat16(f);
    EXPECT_EQ(to_float(to_bfloat16(f)), static_cast<float>(want)) << f;
  }
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::nanf("")))));
}

TEST(TensorView, ShapeAndSize) {
  std::vector<double> v(12);
  TensorView t(v.data(), DType::kFloat64, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.str(), "float64[3, 4] on cpu");
  TensorView from_vec(v);
  EXPECT_EQ(from_vec.numel(), 12);
  EXPECT_EQ(from_vec.dtype(), DType::kFloat64);
  TensorView empty(nullptr, DType::kInt8, {0, 5});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(TensorView(v.data(), DType::kFloat32, {}).numel(), 1);  // a scalar
}

TEST(TensorView, RejectsBadShapes) {
  float x = 0;
  EXPECT_TUTTI_ERROR(TensorView(&x, DType::kFloat32, {2, -1}), ErrorCode::kInvalidArgument,
                     "negative dimension -1");
  EXPECT_TUTTI_ERROR(TensorView(nullptr, DType::kFloat32, {3}), ErrorCode::kInvalidArgument,
                     "null data pointer");
  EXPECT_TUTTI_ERROR(TensorView(&x, DType::kFloat64, {int64_t(1) << 40, int64_t(1) << 40}),
                     ErrorCode::kInvalidArgument, "overflow");
}

TEST(DLPack, ContiguousTensorsBecomeViews) {
  std::vector<float> data(6);
  int64_t shape[] = {2, 3};
  int64_t strides[] = {3, 1};
  DLTensor t{};
  t.data = data.data();
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 4;
  TensorView v = from_dlpack(t);
  EXPECT_EQ(v.dtype(), DType::kFloat32);
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v.data(), static_cast<void*>(data.data() + 1));
  t.strides = nullptr;
  EXPECT_EQ(from_dlpack(t).numel(), 6);
  t.dtype = {kDLBfloat, 16, 1};
  EXPECT_EQ(from_dlpack(t).dtype(), DType::kBFloat16);
  t.device = {kDLCUDA, 1};
  EXPECT_EQ(from_dlpack(t).device(), Device::cuda(1));
}

TEST(DLPack, RejectsWhatTuttiCannotView) {
  std::vector<float> data(6);
  int64_t shape[] = {2, 3};
  int64_t transposed[] = {1, 2};
  DLTensor t{};
  t.data = data.data();
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = transposed;
  EXPECT_TUTTI_ERROR(from_dlpack(t), ErrorCode::kInvalidArgument, "not contiguous");
  t.strides = nullptr;
  t.dtype = {kDLFloat, 32, 4};
  EXPECT_TUTTI_ERROR(from_dlpack(t), ErrorCode::kInvalidArgument, "4 lanes");
  t.dtype = {kDLInt, 16, 1};
  EXPECT_TUTTI_ERROR(from_dlpack(t), ErrorCode::kInvalidArgument, "16 bits");
  t.dtype = {kDLFloat, 32, 1};
  t.device = {kDLVulkan, 0};
  EXPECT_TUTTI_ERROR(from_dlpack(t), ErrorCode::kInvalidArgument, "device type");
  // Strides given for a shape whose element count overflows int64 (found by fuzzing): refused
  // by name, no overflow on the way.
  t.device = {kDLCPU, 0};
  int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
  int64_t huge_strides[] = {int64_t(1) << 40, 1};
  t.shape = huge;
  t.strides = huge_strides;
  EXPECT_TUTTI_ERROR(from_dlpack(t), ErrorCode::kInvalidArgument, "overflows int64", "dimension 0");
}

}  // namespace
}  // namespace tutti::testing
