#include "tutti/types.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "tutti/error.h"

namespace tutti {
namespace {

uint32_t float_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

float bits_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

float to_float(Float16 v) noexcept {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: shift the mantissa up until its implicit bit appears.
    int e = 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3ffu;
    return bits_float(sign | (static_cast<uint32_t>(e + 112) << 23) | (mant << 13));
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

Float16 to_float16(float value) noexcept {
  const uint32_t x = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const int exp = static_cast<int>((x >> 23) & 0xffu);
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) {  // inf stays inf; NaN stays a quiet NaN
    return Float16{static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u))};
  }
  const int e = exp - 127 + 15;
  if (e >= 31) return Float16{static_cast<uint16_t>(sign | 0x7c00u)};
  if (e <= 0) {
    if (e < -10) return Float16{sign};
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return Float16{static_cast<uint16_t>(sign | half)};
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // a carry may reach inf: right
  return Float16{static_cast<uint16_t>(sign | half)};
}

float to_float(BFloat16 v) noexcept {
  return bits_float(static_cast<uint32_t>(v.bits) << 16);
}

BFloat16 to_bfloat16(float value) noexcept {
  const uint32_t x = float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return BFloat16{static_cast<uint16_t>((x >> 16) | 0x40u)};  // quiet NaN
  }
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
}

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt32: return "int32";
    case DType::kUInt32: return "uint32";
    case DType::kInt64: return "int64";
    case DType::kUInt64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "unknown";
}

const char* to_string(DeviceType type) noexcept {
  return type == DeviceType::kCPU ? "cpu" : "cuda";
}

DType parse_dtype(const std::string& text) {
  static const std::pair<const char*, DType> kNames[] = {
      {"bool", DType::kBool},     {"int8", DType::kInt8},       {"uint8", DType::kUInt8},
      {"int32", DType::kInt32},   {"int", DType::kInt32},       {"uint32", DType::kUInt32},
      {"int64", DType::kInt64},   {"uint64", DType::kUInt64},   {"float16", DType::kFloat16},
      {"half", DType::kFloat16},  {"fp16", DType::kFloat16},    {"bfloat16", DType::kBFloat16},
      {"bf16", DType::kBFloat16}, {"float32", DType::kFloat32}, {"float", DType::kFloat32},
      {"fp32", DType::kFloat32},  {"float64", DType::kFloat64}, {"double", DType::kFloat64},
      {"fp64", DType::kFloat64},
  };
  const std::string key = lower(text);
  for (const auto& [name, dtype] : kNames) {
    if (key == name) return dtype;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "unknown dtype '" + text +
                  "' (expected bool, int8, uint8, int32, uint32, int64, uint64, float16, "
                  "bfloat16, float32 or float64)");
}

ReduceOp parse_reduce_op(const std::string& text) {
  const std::string key = lower(text);
  if (key == "sum") return ReduceOp::kSum;
  if (key == "prod" || key == "product") return ReduceOp::kProduct;
  if (key == "min") return ReduceOp::kMin;
  if (key == "max") return ReduceOp::kMax;
  if (key == "avg" || key == "mean") return ReduceOp::kAvg;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown reduce op '" + text + "' (expected sum, prod, min, max or avg)");
}

}  // namespace tutti
