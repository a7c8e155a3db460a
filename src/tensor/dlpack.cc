#include "tutti/dlpack.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "tutti/error.h"

namespace tutti {
namespace {

DType dtype_from(const DLDataType& t) {
  const std::string what = "code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
                           " bits, " + std::to_string(t.lanes) + " lanes";
  if (t.lanes != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "from_dlpack: vector dtypes are not supported (" + what + ")");
  }
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) return DType::kInt8;
      if (t.bits == 32) return DType::kInt32;
      if (t.bits == 64) return DType::kInt64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::kUInt8;
      if (t.bits == 32) return DType::kUInt32;
      if (t.bits == 64) return DType::kUInt64;
      break;
    case kDLFloat:
      if (t.bits == 16) return DType::kFloat16;
      if (t.bits == 32) return DType::kFloat32;
      if (t.bits == 64) return DType::kFloat64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    default: break;
  }
  throw Error(ErrorCode::kInvalidArgument, "from_dlpack: unsupported dtype (" + what + ")");
}

}  // namespace

TensorView from_dlpack(const DLTensor& tensor) {
  const DType dtype = dtype_from(tensor.dtype);
  Device device;
  // The device type as the integer it is: a producer may have written any value there (a newer
  // DLPack's device, or garbage), and loading one outside the enum's range as the enum is
  // undefined behaviour (found by fuzzing).
  int32_t device_type = 0;
  static_assert(sizeof(tensor.device.device_type) == sizeof(device_type), "DLPack's int32 field");
  std::memcpy(&device_type, &tensor.device.device_type, sizeof(device_type));
  switch (device_type) {
    case kDLCPU:
    case kDLCUDAHost: device = Device::cpu(); break;
    case kDLCUDA: device = Device::cuda(tensor.device.device_id); break;
    default:
      throw Error(ErrorCode::kInvalidArgument, "from_dlpack: unsupported device type " +
                                                   std::to_string(device_type) +
                                                   " (expected CPU, CUDA host or CUDA)");
  }
  if (tensor.ndim < 0 || (tensor.ndim > 0 && tensor.shape == nullptr)) {
    throw Error(ErrorCode::kInvalidArgument,
                "from_dlpack: bad ndim " + std::to_string(tensor.ndim) + " or null shape");
  }
  std::vector<int64_t> shape(tensor.shape, tensor.shape + tensor.ndim);
  if (tensor.strides != nullptr) {
    // Row-major compact: each stride is the product of the later dimensions. Dimensions of
    // size 1 may carry any stride (PyTorch gives them arbitrary ones).
    int64_t expected = 1;
    for (int i = tensor.ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && tensor.strides[i] != expected) {
        throw Error(ErrorCode::kInvalidArgument,
                    "from_dlpack: tensor is not contiguous: dimension " + std::to_string(i) +
                        " has stride " + std::to_string(tensor.strides[i]) + ", expected " +
                        std::to_string(expected) + " (make it contiguous first)");
      }
      // A shape whose product overflows is refused here (the view would refuse it too, but
      // the product must not overflow on the way; found by fuzzing).
      if (__builtin_mul_overflow(expected, shape[i], &expected)) {
        throw Error(ErrorCode::kInvalidArgument,
                    "from_dlpack: the shape's element count overflows int64 at dimension " +
                        std::to_string(i) + " (size " + std::to_string(shape[i]) + ")");
      }
    }
  }
  // The offset must not carry the pointer past the end of the address space (pointer arithmetic
  // that wraps is undefined; found by fuzzing).
  void* data = nullptr;
  if (tensor.data != nullptr) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(tensor.data);
    if (tensor.byte_offset > UINTPTR_MAX - base) {
      throw Error(ErrorCode::kInvalidArgument,
                  "from_dlpack: byte offset " + std::to_string(tensor.byte_offset) +
                      " runs past the end of the address space from the data pointer");
    }
    data = reinterpret_cast<void*>(base + static_cast<uintptr_t>(tensor.byte_offset));
  }
  return TensorView(data, dtype, std::move(shape), device);
}

DLDataType to_dlpack_dtype(DType dtype) {
  DLDataType t;
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt32:
    case DType::kInt64: t.code = kDLInt; break;
    case DType::kBool:
    case DType::kUInt8:
    case DType::kUInt32:
    case DType::kUInt64: t.code = kDLUInt; break;
    case DType::kBFloat16: t.code = kDLBfloat; break;
    default: t.code = kDLFloat; break;
  }
  return t;
}

}  // namespace tutti
