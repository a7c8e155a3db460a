// The stand-in NCCL's arithmetic (tests only): element-wise reductions over every rank's buffer,
// in rank order, for each NCCL type and op.
//
// Integers wrap as on the GPU; floating types are reduced in double and rounded once to the
// type (float16 with the compiler's _Float16, bfloat16 to nearest even), which for the tests'
// exact inputs gives what NCCL gives. Avg is the sum divided by the number of ranks.
#pragma once

#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace tutti::standin {

inline size_t nccl_type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;  // the fp8 types: not in the stand-in
  }
}

namespace detail {

struct Bf16 {
  uint16_t bits;
};

// float16: the compiler's where it has _Float16, else bits converted here (clang < 15 on x86-64,
// the sanitizer build), round to nearest even either way.
#if defined(__FLT16_MAX__)
using Half = _Float16;
inline double load(const Half* p, size_t i) {
  return static_cast<double>(p[i]);
}
inline void store(Half* p, size_t i, double v) {
  p[i] = static_cast<Half>(v);
}
#else
struct Half {
  uint16_t bits;
};
inline double load(const Half* p, size_t i) {
  const uint32_t h = p[i].bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0 : 1.0) * man * std::ldexp(1.0, -24);  // zero, subnormal
  uint32_t bits =
      sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(Half* p, size_t i, double v) {
  const float f = static_cast<float>(v);
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  uint16_t out;
  if (a > 0x7f800000u) {
    out = 0x7e00;  // NaN
  } else if (a >= 0x477ff000u) {
    out = 0x7c00;  // rounds to infinity
  } else if (a < 0x38800000u) {
    // Subnormal (or zero): add 0.5 so the float's rounding does the half's.
    float g;
    std::memcpy(&g, &a, 4);
    g += 0.5f;
    uint32_t gb;
    std::memcpy(&gb, &g, 4);
    out = static_cast<uint16_t>(gb - 0x3f000000u);
  } else {
    const uint32_t odd = (a >> 13) & 1u;
    out = static_cast<uint16_t>((a + 0xc8000fffu + odd) >> 13);
  }
  p[i].bits = static_cast<uint16_t>(sign | out);
}
#endif
inline double load(const Bf16* p, size_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i].bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
template <typename T>
double load(const T* p, size_t i) {
  return static_cast<double>(p[i]);
}

inline void store(Bf16* p, size_t i, double v) {
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  p[i].bits = static_cast<uint16_t>(bits >> 16);
}
template <typename T>
void store(T* p, size_t i, double v) {
  p[i] = static_cast<T>(v);
}

template <typename T>
void reduce_floating(void* out, const std::vector<const void*>& in, size_t count, ncclRedOp_t op) {
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    double acc = load(static_cast<const T*>(in[0]), i);
    for (size_t r = 1; r < in.size(); ++r) {
      const double v = load(static_cast<const T*>(in[r]), i);
      switch (op) {
        case ncclSum:
        case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        default: break;
      }
    }
    if (op == ncclAvg) acc /= static_cast<double>(in.size());
    store(o, i, acc);
  }
}

template <typename T>
void reduce_integer(void* out, const std::vector<const void*>& in, size_t count, ncclRedOp_t op) {
  using U = std::make_unsigned_t<T>;  // wraps instead of overflowing
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(in[0])[i];
    for (size_t r = 1; r < in.size(); ++r) {
      const T v = static_cast<const T*>(in[r])[i];
      switch (op) {
        case ncclSum:
        case ncclAvg: acc = static_cast<T>(static_cast<U>(acc) + static_cast<U>(v)); break;
        case ncclProd: acc = static_cast<T>(static_cast<U>(acc) * static_cast<U>(v)); break;
        case ncclMax: acc = v > acc ? v : acc; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        default: break;
      }
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(in.size()));
    o[i] = acc;
  }
}

}  // namespace detail

// out[i] = in[0][i] op in[1][i] op ... (out may be one of the inputs: each element is read
// from every input before it is written).
inline void reduce(void* out, const std::vector<const void*>& in, size_t count, ncclDataType_t t,
                   ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: detail::reduce_integer<int8_t>(out, in, count, op); break;
    case ncclUint8: detail::reduce_integer<uint8_t>(out, in, count, op); break;
    case ncclInt32: detail::reduce_integer<int32_t>(out, in, count, op); break;
    case ncclUint32: detail::reduce_integer<uint32_t>(out, in, count, op); break;
    case ncclInt64: detail::reduce_integer<int64_t>(out, in, count, op); break;
    case ncclUint64: detail::reduce_integer<uint64_t>(out, in, count, op); break;
    case ncclFloat16: detail::reduce_floating<detail::Half>(out, in, count, op); break;
    case ncclBfloat16: detail::reduce_floating<detail::Bf16>(out, in, count, op); break;
    case ncclFloat32: detail::reduce_floating<float>(out, in, count, op); break;
    case ncclFloat64: detail::reduce_floating<double>(out, in, count, op); break;
    default: break;
  }
}

}  // namespace tutti::standin
