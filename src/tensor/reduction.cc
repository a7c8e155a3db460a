#include "tensor/reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

// Every kernel is built twice, for x86-64-v3 (AVX2, FMA, F16C) and for the baseline, and the
// loader picks the best one the CPU runs (GCC function multiversioning). Not under
// ThreadSanitizer: the loader runs the instrumented resolvers before TSan is initialised, and
// the process dies before main.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TUTTI_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TUTTI_MULTIVERSION
#endif

namespace tutti::detail {
namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Prod {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};

// Plain loops without restrict: GCC vectorises them with a run-time alias check, and they stay
// correct when out aliases an input.
template <typename T, typename Op>
TUTTI_MULTIVERSION void reduce_plain(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

// float16 through float32, rounding once per step (the compiler's _Float16 conversions round to
// nearest even; with F16C they are single instructions). Compilers without _Float16 on this
// target (clang before 15 on x86-64) convert in software, with the same rounding.
#if defined(__FLT16_MAX__)
using Half = _Float16;
inline float half_to_float(Half v) {
  return static_cast<float>(v);
}
inline Half float_to_half(float f) {
  return static_cast<Half>(f);
}
#else
using Half = Float16;
inline float half_to_float(Half v) {
  return to_float(v);
}
inline Half float_to_half(float f) {
  return to_float16(f);
}
#endif

template <typename Op>
TUTTI_MULTIVERSION void reduce_f16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<Half*>(out);
  const auto* x = static_cast<const Half*>(a);
  const auto* y = static_cast<const Half*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = float_to_half(Op::apply(half_to_float(x[i]), half_to_float(y[i])));
  }
}

inline float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// bfloat16 through float32 with integer conversions (they vectorise).
template <typename Op>
TUTTI_MULTIVERSION void reduce_bf16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i)
    o[i] = float_to_bf16(Op::apply(bf16_to_float(x[i]), bf16_to_float(y[i])));
}

// bool: one byte, 0 or non-zero; or for sum/max, and for prod/min.
template <bool kOr>
TUTTI_MULTIVERSION void reduce_bool(void* out, const void* a, const void* b, size_t n) {
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
    case DType::kFloat16: return reduce_f16<Op>;
    case DType::kBFloat16: return reduce_bf16<Op>;
    case DType::kFloat32: return reduce_plain<float, Op>;
    case DType::kFloat64: return reduce_plain<double, Op>;
  }
  return nullptr;
}

template <typename T>
TUTTI_MULTIVERSION void divide(T* data, size_t n, T d) {
  for (size_t i = 0; i < n; ++i) data[i] /= d;
}

TUTTI_MULTIVERSION void divide_f16(Half* data, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) data[i] = float_to_half(half_to_float(data[i]) / d);
}

TUTTI_MULTIVERSION void divide_bf16(uint16_t* data, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) data[i] = float_to_bf16(bf16_to_float(data[i]) / d);
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

void reduce_many(ReduceFn fn, void* out, const void* const* inputs, int count, size_t n,
                 size_t element_size) noexcept {
  if (count == 1) {
    if (out != inputs[0]) std::memmove(out, inputs[0], n * element_size);
    return;
  }
  const size_t block = std::max<size_t>(1, kReduceBlockBytes / element_size);
  auto* o = static_cast<char*>(out);
  for (size_t start = 0; start < n; start += block) {
    const size_t len = std::min(block, n - start);
    const size_t off = start * element_size;
    fn(o + off, static_cast<const char*>(inputs[0]) + off,
       static_cast<const char*>(inputs[1]) + off, len);
    for (int k = 2; k < count; ++k) {
      fn(o + off, o + off, static_cast<const char*>(inputs[k]) + off, len);
    }
  }
}

void scale_average(void* data, DType dtype, size_t n, int divisor) noexcept {
  switch (dtype) {
    case DType::kFloat16:
      divide_f16(static_cast<Half*>(data), n, static_cast<float>(divisor));
      break;
    case DType::kBFloat16:
      divide_bf16(static_cast<uint16_t*>(data), n, static_cast<float>(divisor));
      break;
    case DType::kFloat32: divide(static_cast<float*>(data), n, static_cast<float>(divisor)); break;
    case DType::kFloat64:
      divide(static_cast<double*>(data), n, static_cast<double>(divisor));
      break;
    default: break;
  }
}

}  // namespace tutti::detail
