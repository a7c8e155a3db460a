#include "tutti/dlpack.h"

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
    default:
      break;
  }
  throw Error(ErrorCode::kInvalidArgument, "from_dlpack: unsupported dtype (" + what + ")");
}

}  // namespace

TensorView from_dlpack(const DLTensor& tensor) {
  const DType dtype = dtype_from(tensor.dtype);
  Device device;
  switch (tensor.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: device = Device::cpu(); break;
    case kDLCUDA: device = Device::cuda(tensor.device.device_id); break;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  "from_dlpack: unsupported device type " +
                      std::to_string(static_cast<int>(tensor.device.device_type)) +
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
      expected *= shape[i];
    }
  }
  void* data = tensor.data == nullptr
                   ? nullptr
                   : static_cast<char*>(tensor.data) + tensor.byte_offset;
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
