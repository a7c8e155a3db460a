// Element types, reduction operators and devices: the vocabulary of every tensor and op.
//
// All functions here are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tutti/export.h"

namespace tutti {

enum class DType {
  kBool,
  kInt8,
  kUInt8,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

// kAvg is only defined for floating types. For kBool, kSum and kMax are logical or, kProduct
// and kMin logical and.
enum class ReduceOp { kSum, kProduct, kMin, kMax, kAvg };

enum class DeviceType { kCPU, kCUDA };

struct TUTTI_API Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return Device{DeviceType::kCPU, 0}; }
  static Device cuda(int index) { return Device{DeviceType::kCUDA, index}; }

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;  // "cpu", "cuda:1"

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::kCPU || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// 16-bit floating storage types, so that std::vector<Float16> deduces kFloat16. They hold the
// bits only; convert with the functions below.
struct Float16 {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

// Round-to-nearest-even conversions.
TUTTI_API float to_float(Float16 v) noexcept;
TUTTI_API float to_float(BFloat16 v) noexcept;
TUTTI_API Float16 to_float16(float v) noexcept;
TUTTI_API BFloat16 to_bfloat16(float v) noexcept;

// Bytes per element (inline: every op asks).
constexpr size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8: return 1;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64: return 8;
  }
  return 0;
}
constexpr bool is_floating(DType dtype) noexcept {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}
TUTTI_API const char* to_string(DType dtype) noexcept;      // "float32"
TUTTI_API const char* to_string(ReduceOp op) noexcept;      // "sum"
TUTTI_API const char* to_string(DeviceType type) noexcept;  // "cpu"

// Parses "float32", "fp32", "float", "int64"... and "sum", "prod", "min", "max", "avg";
// throws tutti::Error(kInvalidArgument) naming the text otherwise.
TUTTI_API DType parse_dtype(const std::string& text);
TUTTI_API ReduceOp parse_reduce_op(const std::string& text);

namespace detail {
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr DType value = DType::kUInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr DType value = DType::kUInt64;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
#if defined(__linux__) && defined(__LP64__)
// On LP64 Linux int64_t is long, so long long is a distinct type of the same width.
template <>
struct DTypeOf<long long> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<unsigned long long> {
  static constexpr DType value = DType::kUInt64;
};
#endif
}  // namespace detail

// The DType of a C++ element type, at compile time: dtype_of<float>() == DType::kFloat32.
template <typename T>
constexpr DType dtype_of() {
  return detail::DTypeOf<std::remove_cv_t<T>>::value;
}

}  // namespace tutti
