#include "nccl_types.h"

#include "tutti/error.h"

namespace tutti::nccl_backend {

ncclDataType_t to_nccl(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8: return ncclUint8;
    case DType::kInt8: return ncclInt8;
    case DType::kInt32: return ncclInt32;
    case DType::kUInt32: return ncclUint32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt64: return ncclUint64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
  }
  throw Error(ErrorCode::kInvalidArgument,
              std::string("nccl: no NCCL type for dtype ") + to_string(dtype));
}

ncclRedOp_t to_nccl(ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) return ncclMax;
    if (op == ReduceOp::kProduct || op == ReduceOp::kMin) return ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw Error(ErrorCode::kInvalidArgument,
              std::string("nccl: no NCCL reduction for ") + to_string(op));
}

std::string device_list_key(const std::vector<int>& devices) {
  std::string key;
  for (int d : devices) key += (key.empty() ? "" : ",") + std::to_string(d);
  return key;
}

std::string device_list_key(const std::vector<TensorView>& tensors) {
  std::vector<int> devices;
  for (const auto& t : tensors) devices.push_back(t.device().index);
  return device_list_key(devices);
}

}  // namespace tutti::nccl_backend
