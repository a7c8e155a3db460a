// How tutti's types and layouts map onto NCCL's (internal; pure functions, testable without a
// GPU).
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "tutti/tensor_view.h"
#include "tutti/types.h"

namespace tutti::nccl_backend {

// bool travels as uint8 (values 0 and 1); every other dtype has an NCCL twin.
ncclDataType_t to_nccl(DType dtype);

// For bool, sum and max are logical or (NCCL max on 0/1), product and min logical and (NCCL
// min); avg is ncclAvg.
ncclRedOp_t to_nccl(ReduceOp op, DType dtype);

// The communicator cache key of a device list: "0" or "0,1,3".
std::string device_list_key(const std::vector<int>& devices);
std::string device_list_key(const std::vector<TensorView>& tensors);

// NCCL rank of a process's local device: rank x devices per process + local index (as Ray).
inline int nccl_rank(int rank, int devices_per_rank, int local_index) {
  return rank * devices_per_rank + local_index;
}

}  // namespace tutti::nccl_backend
