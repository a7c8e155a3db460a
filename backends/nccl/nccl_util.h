// Small helpers the NCCL backend's files share (internal): CUDA error checks, a scoped current
// device, and an NCCL group that always ends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <new>
#include <string>

#include "nccl_api.h"
#include "tutti/error.h"

namespace tutti::nccl_backend {

// TUTTI_NCCL_BLOCKING=1: blocking communicators (see NcclBackend::init_comms).
inline bool blocking_communicators() {
  const char* v = std::getenv("TUTTI_NCCL_BLOCKING");
  return v != nullptr && std::string(v) == "1";
}

inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw Error(ErrorCode::kInternal, "nccl: " + what + ": " + cudaGetErrorString(e));
  }
}

// Makes a device current for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (device != previous_) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  // For destructors, which must not throw: a failed switch shows in the calls that follow.
  DeviceGuard(int device, std::nothrow_t) {
    cudaGetDevice(&previous_);
    if (device != previous_) cudaSetDevice(device);
  }
  // Always sets it back, also when it never switched: on an H200 (CUDA 13, NCCL 2.28) skipping
  // the unneeded cudaSetDevice made an 8-byte blocking allreduce 1.34x slower (2.6 -> 3.5 us,
  // scripts/device/ab-nccl.sh, 5 pairs); the cause was not found.
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// An NCCL group that always ends: a throw between ncclGroupStart and ncclGroupEnd would leave
// this thread's later NCCL calls, an abort included, queued in a group that never ends.
class NcclGroup {
 public:
  explicit NcclGroup(const NcclApi& api) : api_(api) {}
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) api_.GroupEnd();
  }
  ncclResult_t start() {
    const ncclResult_t r = api_.GroupStart();
    open_ = r == ncclSuccess;
    return r;
  }
  ncclResult_t end() {
    open_ = false;
    return api_.GroupEnd();
  }

 private:
  const NcclApi& api_;
  bool open_ = false;
};

}  // namespace tutti::nccl_backend
