// Every value, size and offset tutti's declared CUDA and NCCL headers (backends/cuda/declared/)
// state, listed once: cuda_layout_toolkit.cc and cuda_layout_declared.cc each evaluate the list
// against one set of headers, and cuda_declared_test.cc compares the two.
#pragma once

#include <string>
#include <utility>
#include <vector>

using CudaLayout = std::vector<std::pair<std::string, long long>>;

// What the compared headers must agree on exactly.
// clang-format off
#define TUTTI_CUDA_LAYOUT(X)                                                                    \
  X(cudaSuccess) X(cudaErrorInvalidValue) X(cudaErrorMemoryAllocation)                          \
  X(cudaErrorInitializationError) X(cudaErrorInvalidMemcpyDirection)                            \
  X(cudaErrorInsufficientDriver) X(cudaErrorCallRequiresNewerDriver) X(cudaErrorNoDevice)       \
  X(cudaErrorInvalidDevice) X(cudaErrorSharedObjectInitFailed)                                  \
  X(cudaErrorInvalidResourceHandle) X(cudaErrorNotReady) X(cudaErrorNotSupported)               \
  X(cudaErrorUnknown) X(cudaMemcpyHostToHost) X(cudaMemcpyHostToDevice)                         \
  X(cudaMemcpyDeviceToHost) X(cudaMemcpyDeviceToDevice) X(cudaMemcpyDefault)                    \
  X(cudaMemoryTypeUnregistered) X(cudaMemoryTypeHost) X(cudaMemoryTypeDevice)                   \
  X(cudaMemoryTypeManaged) X(cudaDriverEntryPointSuccess) X(cudaDriverEntryPointSymbolNotFound) \
  X(cudaDriverEntryPointVersionNotSufficent) X(cudaEventDefault) X(cudaEventBlockingSync)       \
  X(cudaEventDisableTiming) X(cudaEventInterprocess) X(cudaEventWaitDefault)                    \
  X(cudaStreamDefault) X(cudaStreamNonBlocking) X(cudaIpcMemLazyEnablePeerAccess)               \
  X(cudaEnableDefault) X(CUDA_IPC_HANDLE_SIZE) X(reinterpret_cast<long long>(cudaStreamLegacy)) \
  X(reinterpret_cast<long long>(cudaStreamPerThread)) X(sizeof(cudaError_t))                    \
  X(sizeof(cudaMemcpyKind)) X(sizeof(cudaIpcMemHandle_t)) X(sizeof(cudaIpcEventHandle_t))       \
  X(sizeof(cudaPointerAttributes)) X(offsetof(cudaPointerAttributes, type))                     \
  X(offsetof(cudaPointerAttributes, device)) X(offsetof(cudaPointerAttributes, devicePointer))  \
  X(offsetof(cudaPointerAttributes, hostPointer)) X(offsetof(cudaDeviceProp, uuid))             \
  X(sizeof(cudaUUID_t)) X(sizeof(cudaStream_t)) X(sizeof(cudaEvent_t))                          \
  X(ncclSuccess) X(ncclUnhandledCudaError) X(ncclSystemError) X(ncclInternalError)              \
  X(ncclInvalidArgument) X(ncclInvalidUsage) X(ncclRemoteError) X(ncclInProgress)               \
  X(ncclNumResults) X(ncclInt8) X(ncclChar) X(ncclUint8) X(ncclInt32) X(ncclInt) X(ncclUint32)  \
  X(ncclInt64) X(ncclUint64) X(ncclFloat16) X(ncclHalf) X(ncclFloat32) X(ncclFloat)             \
  X(ncclFloat64) X(ncclDouble) X(ncclBfloat16) X(ncclFloat8e4m3) X(ncclFloat8e5m2)              \
  X(ncclNumTypes) X(ncclSum) X(ncclProd) X(ncclMax) X(ncclMin) X(ncclAvg) X(ncclNumOps)         \
  X(ncclMaxRedOp) X(NCCL_SPLIT_NOCOLOR) X(NCCL_CONFIG_UNDEF_INT) X(NCCL_UNIQUE_ID_BYTES)        \
  X(NCCL_SHRINK_DEFAULT) X(NCCL_SHRINK_ABORT) X(NCCL_REVOKE_DEFAULT)                            \
  X(sizeof(ncclUniqueId)) X(sizeof(ncclResult_t)) X(sizeof(ncclDataType_t))                     \
  X(sizeof(ncclRedOp_t)) X(sizeof(ncclComm_t)) X(NCCL_MAJOR) X(NCCL_MINOR)                      \
  X(NCCL_VERSION(2, 28, 0)) X(NCCL_VERSION(2, 8, 4)) X(sizeof(ncclConfig_t))                    \
  X(offsetof(ncclConfig_t, magic)) X(offsetof(ncclConfig_t, version))                           \
  X(offsetof(ncclConfig_t, blocking)) X(offsetof(ncclConfig_t, netName))                        \
  X(offsetof(ncclConfig_t, commName)) X(offsetof(ncclConfig_t, shrinkShare))                    \
  X(offsetof(ncclConfig_t, nvlinkCentricSched)) X(initialized_config().magic)                   \
  X(initialized_config().blocking) X(initialized_config().size)
// clang-format on

// Sizes where the declared struct is only a large enough buffer (listed apart: declared >= real).
#define TUTTI_CUDA_LAYOUT_AT_LEAST(X) X(sizeof(cudaDeviceProp))

#define TUTTI_CUDA_LAYOUT_ENTRY(expr) {#expr, static_cast<long long>(expr)},

// Defines `CudaLayout name(bool at_least)`: the list against the headers included before.
#define TUTTI_DEFINE_CUDA_LAYOUT(name)                                                    \
  namespace {                                                                             \
  ncclConfig_t initialized_config() {                                                     \
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;                                             \
    return c;                                                                             \
  }                                                                                       \
  }                                                                                       \
  CudaLayout name(bool at_least) {                                                        \
    if (at_least) return CudaLayout{TUTTI_CUDA_LAYOUT_AT_LEAST(TUTTI_CUDA_LAYOUT_ENTRY)}; \
    return CudaLayout{TUTTI_CUDA_LAYOUT(TUTTI_CUDA_LAYOUT_ENTRY)};                        \
  }

CudaLayout cuda_layout_toolkit(bool at_least);
CudaLayout cuda_layout_declared(bool at_least);
