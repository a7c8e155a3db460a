// The cuda_ipc transport's CUDA helpers and its consumer side of owners' memory (internal): the
// owners' allocations and events this process opened, cached (TUTTI_RDT_IPC_CACHE mappings,
// default 256, least recently used dropped first; a borrow's views keep their own reference).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "tutti/error.h"

namespace tutti::cuda_ipc {

constexpr size_t kHandle = CUDA_IPC_HANDLE_SIZE;
// The driver's cuMemGetAddressRange (CUresult, CUdeviceptr*, size_t*, CUdeviceptr).
using GetAddressRange = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);

// The size of the allocation that begins at `base`, as `range` gives it; 0 where it is not known
// (no range, a failed call, or `base` not the start of an allocation).
inline uint64_t allocation_size(GetAddressRange range, unsigned long long base) {
  unsigned long long start = 0;
  size_t size = 0;
  if (range == nullptr || range(&start, &size, base) != 0 || start != base) return 0;
  return size;
}

[[noreturn]] void cuda_fail(ErrorCode code, const std::string& what, cudaError_t e);
void check(cudaError_t e, const std::string& what);
std::string hex(const uint8_t* p, size_t n);

// Sets the current device for a scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int old_ = 0;
};

// A consumer's mapping of an owner's allocation; closed when nothing uses it.
struct Opened {
  void* base = nullptr;
  uint64_t size = 0;  // of the allocation as mapped here, where the driver says (0: unknown)
  int device = 0;
  Opened() = default;
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;
  ~Opened();
};

// What a consumer opened of its owners, by owner (the owner agent's UUID, in hex) and handle.
class OpenedHandles {
 public:
  OpenedHandles();  // the cache's size from TUTTI_RDT_IPC_CACHE
  ~OpenedHandles();
  OpenedHandles(const OpenedHandles&) = delete;
  OpenedHandles& operator=(const OpenedHandles&) = delete;

  // The owner's allocation, mapped on `device` (kIoError when it cannot be: the owner gone);
  // its size from `range` where that knows the mapping.
  std::shared_ptr<Opened> memory(const std::string& owner, const cudaIpcMemHandle_t& handle,
                                 uint64_t buffer_id, int device, GetAddressRange range);
  // The owner's interprocess event (kept until this transport goes).
  cudaEvent_t event(const std::string& owner, const cudaIpcEventHandle_t& handle);

 private:
  std::mutex mutex_;
  size_t limit_ = 256;
  std::list<std::string> lru_;
  std::map<std::string, std::pair<std::shared_ptr<Opened>, std::list<std::string>::iterator>>
      memory_;
  std::map<std::string, cudaEvent_t> events_;
};

}  // namespace tutti::cuda_ipc
