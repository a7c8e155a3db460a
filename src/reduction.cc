#include "reduction.h"

#include <algorithm>
#include <cstdint>

namespace tutti::detail {
namespace {

struct Sum { template <typename T> static T apply(T a, T b) { return static_cast<T>(a + b); } };
struct Prod { template <typename T> static T apply(T a, T b) { return static_cast<T>(a * b); } };
struct Min { template <typename T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return std::max(a, b); } };

// Plain loops over restrict-free pointers: GCC vectorises them at -O2/-O3 with a runtime alias
// check, and they stay correct when out aliases an input.
template <typename T, typename Op>
void reduce_plain(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

template <typename H, typename Op>
void reduce_half(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<H*>(out);
  const auto* x = static_cast<const H*>(a);
  const auto* y = static_cast<const H*>(b);
  for (size_t i = 0; i < n; ++i) {
    const float r = Op::apply(to_float(x[i]), to_float(y[i]));
    if constexpr (std::is_same<H, Float16>::value) {
      o[i] = to_float16(r);
    } else {
      o[i] = to_bfloat16(r);
    }
  }
}

// bool: stored as one byte, 0 or non-zero; or for sum/max, and for prod/min.
template <bool kOr>
void reduce_bool(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = kOr ? static_cast<uint8_t>((x[i] != 0) | (y[i] != 0))
               : static_cast<uint8_t>((x[i] != 0) & (y[i] != 0));
  }
}

template <typename Op>
ReduceFn for_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBool: return nullptr;  // handled by the caller
    case DType::kInt8: return reduce_plain<int8_t, Op>;
    case DType::kUInt8: return reduce_plain<uint8_t, Op>;
    case DType::kInt32: return reduce_plain<int32_t, Op>;
    case DType::kUInt32: return reduce_plain<uint32_t, Op>;
    case DType::kInt64: return reduce_plain<int64_t, Op>;
    case DType::kUInt64: return reduce_plain<uint64_t, Op>;
    case DType::kFloat16: return reduce_half<Float16, Op>;
    case DType::kBFloat16: return reduce_half<BFloat16, Op>;
    case DType::kFloat32: return reduce_plain<float, Op>;
    case DType::kFloat64: return reduce_plain<double, Op>;
  }
  return nullptr;
}

template <typename T>
void divide(T* data, size_t n, int divisor) {
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) data[i] /= d;
}

template <typename H>
void divide_half(H* data, size_t n, int divisor) {
  for (size_t i = 0; i < n; ++i) {
    const float r = to_float(data[i]) / static_cast<float>(divisor);
    if constexpr (std::is_same<H, Float16>::value) {
      data[i] = to_float16(r);
    } else {
      data[i] = to_bfloat16(r);
    }
  }
}

}  // namespace

ReduceFn reduce_function(DType dtype, ReduceOp op) noexcept {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kAvg) return nullptr;
    return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? reduce_bool<true> : reduce_bool<false>;
  }
  switch (op) {
    case ReduceOp::kSum: return for_dtype<Sum>(dtype);
    case ReduceOp::kProduct: return for_dtype<Prod>(dtype);
    case ReduceOp::kMin: return for_dtype<Min>(dtype);
    case ReduceOp::kMax: return for_dtype<Max>(dtype);
    case ReduceOp::kAvg: return is_floating(dtype) ? for_dtype<Sum>(dtype) : nullptr;
  }
  return nullptr;
}

void scale_average(void* data, DType dtype, size_t n, int divisor) noexcept {
  switch (dtype) {
    case DType::kFloat16: divide_half(static_cast<Float16*>(data), n, divisor); break;
    case DType::kBFloat16: divide_half(static_cast<BFloat16*>(data), n, divisor); break;
    case DType::kFloat32: divide(static_cast<float*>(data), n, divisor); break;
    case DType::kFloat64: divide(static_cast<double*>(data), n, divisor); break;
    default: break;
  }
}

}  // namespace tutti::detail
