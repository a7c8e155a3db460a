#include "cuda_ipc_mappings.h"

#include <cstdlib>

namespace tutti::cuda_ipc {

void cuda_fail(ErrorCode code, const std::string& what, cudaError_t e) {
  throw Error(code, "cuda_ipc transport: " + what + ": " + cudaGetErrorString(e));
}

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) cuda_fail(ErrorCode::kIoError, what, e);
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += d[p[i] >> 4];
    out += d[p[i] & 15];
  }
  return out;
}

DeviceScope::DeviceScope(int device) {
  cudaGetDevice(&old_);
  if (device != old_) check(cudaSetDevice(device), "selecting device " + std::to_string(device));
}

DeviceScope::~DeviceScope() {
  int now = old_;
  cudaGetDevice(&now);
  if (now != old_) cudaSetDevice(old_);
}

Opened::~Opened() {
  if (base != nullptr) {
    DeviceScope scope(device);
    cudaIpcCloseMemHandle(base);
  }
}

OpenedHandles::OpenedHandles() {
  if (const char* v = std::getenv("TUTTI_RDT_IPC_CACHE")) {
    const long n = std::strtol(v, nullptr, 10);
    if (n > 0) limit_ = static_cast<size_t>(n);
  }
}

OpenedHandles::~OpenedHandles() {
  for (auto& [key, e] : events_) cudaEventDestroy(e);
}

std::shared_ptr<Opened> OpenedHandles::memory(const std::string& owner,
                                              const cudaIpcMemHandle_t& handle, uint64_t buffer_id,
                                              int device, GetAddressRange range) {
  const std::string key = owner + hex(reinterpret_cast<const uint8_t*>(&handle), kHandle) + ":" +
                          std::to_string(buffer_id);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = memory_.find(key);
    if (it != memory_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  auto o = std::make_shared<Opened>();
  o->device = device;
  const cudaError_t rc = cudaIpcOpenMemHandle(&o->base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (rc != cudaSuccess) {
    o->base = nullptr;
    cuda_fail(ErrorCode::kIoError, "opening the owner's memory (is the owner alive?)", rc);
  }
  o->size = allocation_size(range, reinterpret_cast<unsigned long long>(o->base));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = memory_.find(key);
  if (it != memory_.end()) return it->second.first;  // opened meanwhile by another get
  lru_.push_front(key);
  memory_[key] = {o, lru_.begin()};
  while (memory_.size() > limit_) {
    memory_.erase(lru_.back());  // borrowed views keep their own reference
    lru_.pop_back();
  }
  return o;
}

cudaEvent_t OpenedHandles::event(const std::string& owner, const cudaIpcEventHandle_t& handle) {
  const std::string key = owner + hex(reinterpret_cast<const uint8_t*>(&handle), sizeof(handle));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(key);
  if (it != events_.end()) return it->second;
  cudaEvent_t e = nullptr;
  const cudaError_t rc = cudaIpcOpenEventHandle(&e, handle);
  if (rc != cudaSuccess) cuda_fail(ErrorCode::kIoError, "opening the owner's event", rc);
  events_[key] = e;
  return e;
}

}  // namespace tutti::cuda_ipc
