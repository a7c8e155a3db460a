// The independent model of what each collective must produce (tests only).
//
// Inputs are small integers chosen so that every sum, product, min and max is exact in every
// dtype; expected values are computed here in double precision, element by element, and
// rounded to the dtype with the compiler's own _Float16 (float16) and a nearest-candidate search
// (bfloat16): never through tutti's reduction or conversion code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tutti/types.h"

namespace tutti::testing {

inline double round_to_bfloat16(double v) {
  // Of the bfloat16 values around v (float's upper 16 bits, then one step up), take the
  // nearest; on a tie, the one whose last mantissa bit is 0.
  const float f = static_cast<float>(v);  // exact for the values the tests use
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t low_bits = bits & 0xffff0000u;
  const uint32_t high_bits = low_bits + 0x10000u;
  float low, high;
  std::memcpy(&low, &low_bits, 4);
  std::memcpy(&high, &high_bits, 4);
  const double dl = std::fabs(v - low), dh = std::fabs(high - v);
  if (dl < dh) return low;
  if (dh < dl) return high;
  return ((low_bits >> 16) & 1u) == 0 ? low : high;
}

// Writes v, rounded to dtype, as element i of data.
inline void write_value(DType dtype, void* data, int64_t i, double v) {
  switch (dtype) {
    case DType::kBool: static_cast<uint8_t*>(data)[i] = v != 0 ? 1 : 0; break;
    case DType::kInt8: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); break;
    case DType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DType::kUInt32: static_cast<uint32_t*>(data)[i] = static_cast<uint32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt64: static_cast<uint64_t*>(data)[i] = static_cast<uint64_t>(v); break;
#if defined(__FLT16_MAX__)
    case DType::kFloat16: static_cast<_Float16*>(data)[i] = static_cast<_Float16>(v); break;
#else
    // No _Float16 in this compiler (clang < 15 on x86-64: the sanitizer and fuzzer build): the
    // library's conversion, which Types.Float16MatchesCompiler checks where there is one.
    case DType::kFloat16: static_cast<Float16*>(data)[i] = to_float16(static_cast<float>(v)); break;
#endif
    case DType::kBFloat16: {
      const float f = static_cast<float>(round_to_bfloat16(v));
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(bits >> 16);
      break;
    }
    case DType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(data)[i] = v; break;
  }
}

inline double read_value(DType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DType::kBool: return static_cast<const uint8_t*>(data)[i] != 0;
    case DType::kInt8: return static_cast<const int8_t*>(data)[i];
    case DType::kUInt8: return static_cast<const uint8_t*>(data)[i];
    case DType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DType::kUInt32: return static_cast<const uint32_t*>(data)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kUInt64: return static_cast<double>(static_cast<const uint64_t*>(data)[i]);
#if defined(__FLT16_MAX__)
    case DType::kFloat16: return static_cast<double>(static_cast<const _Float16*>(data)[i]);
#else
    case DType::kFloat16: return to_float(static_cast<const Float16*>(data)[i]);
#endif
    case DType::kBFloat16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(data)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFloat32: return static_cast<const float*>(data)[i];
    case DType::kFloat64: return static_cast<const double*>(data)[i];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

inline bool is_signed_dtype(DType d) {
  return d == DType::kInt8 || d == DType::kInt32 || d == DType::kInt64 || d == DType::kFloat16 ||
         d == DType::kBFloat16 || d == DType::kFloat32 || d == DType::kFloat64;
}

// Rank r's input element i for reduce op `op` in a world of `world` ranks.
inline double input_value(ReduceOp op, DType dtype, int r, int world, int64_t i) {
  if (dtype == DType::kBool) {
    const bool hit = (i + r) % (world + 1) == 0;
    return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? hit : !hit;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<double>((i + r) % 3);
    case ReduceOp::kProduct: return (r < 3 && (i + r) % 2 == 0) ? 2.0 : 1.0;
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const double v = static_cast<double>((r * 5 + i * 3) % 7);
      return is_signed_dtype(dtype) ? v - 3.0 : v;
    }
  }
  return 0;
}

// The reduction over all ranks of input_value, as a double (before rounding to dtype).
inline double expected_reduction(ReduceOp op, DType dtype, int world, int64_t i) {
  double acc = input_value(op, dtype, 0, world, i);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(op, dtype, r, world, i);
    if (dtype == DType::kBool) {
      acc = (op == ReduceOp::kSum || op == ReduceOp::kMax) ? (acc != 0 || v != 0)
                                                           : (acc != 0 && v != 0);
      continue;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::fmin(acc, v); break;
      case ReduceOp::kMax: acc = std::fmax(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) acc /= world;
  return acc;
}

// v as it reads back after being stored in dtype.
inline double as_dtype(DType dtype, double v) {
  alignas(8) unsigned char buf[8];
  write_value(dtype, buf, 0, v);
  return read_value(dtype, buf, 0);
}

}  // namespace tutti::testing
