// NCCL, loaded at run time (internal to the nccl backend).
//
// The NCCL found at run time (libnccl.so.2, or TUTTI_NCCL_LIBRARY) may be older than the 2.28
// headers tutti is built with, so nothing is linked: every entry point is resolved with dlsym,
// and a version below kMinNcclVersion, or a missing symbol, is a clear Error(kUnavailable).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace tutti::nccl_backend {

// 2.14: ncclCommInitRankConfig with non-blocking communicators, ncclCommFinalize.
constexpr int kMinNcclVersion = 21400;

struct NcclApi {
  int version = 0;  // e.g. 22809
  std::string library;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  // Null where the loaded NCCL lacks them (before 2.27 and 2.28): a failure then aborts the
  // communicators, and a shrink makes new ones through the store.
  ncclResult_t (*CommRevoke)(ncclComm_t, int) = nullptr;
  ncclResult_t (*CommShrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
};

// Loads NCCL once per process; throws Error(kUnavailable) saying what is missing.
const NcclApi& nccl_api();

// True when NCCL loads and at least one CUDA device is visible.
bool nccl_available() noexcept;

}  // namespace tutti::nccl_backend
