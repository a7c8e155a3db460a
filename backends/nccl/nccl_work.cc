#include "nccl_work.h"

#include "tutti/error.h"

namespace tutti::nccl_backend {

EventPool::~EventPool() {
  for (auto& [device, events] : free_) {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
}

cudaEvent_t EventPool::take(int device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& events = free_[device];
    if (!events.empty()) {
      cudaEvent_t e = events.back();
      events.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r != cudaSuccess) {
    throw Error(ErrorCode::kInternal,
                std::string("nccl: cudaEventCreate: ") + cudaGetErrorString(r));
  }
  return e;
}

void EventPool::give_back(int device, cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_[device].push_back(event);
}

NcclWork::~NcclWork() {
  // Only a Work that never reached the backend's list still holds events (its launch threw).
  for (auto& [device, e] : events_) cudaEventDestroy(e);
}

void NcclWork::add_event(int device, cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.emplace_back(device, event);
}

cudaError_t NcclWork::query_locked() const {
  if (settled_) return settled_state_;
  // Events may belong to several devices: a query needs no current device.
  for (const auto& [device, e] : events_) {
    const cudaError_t r = cudaEventQuery(e);
    if (r != cudaSuccess) return r;
  }
  return cudaSuccess;
}

cudaError_t NcclWork::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return query_locked();
}

cudaError_t NcclWork::settle(EventPool& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (settled_) return settled_state_;
  settled_state_ = query_locked();
  settled_ = true;
  for (const auto& [device, e] : events_) pool.give_back(device, e);
  events_.clear();
  return settled_state_;
}

void NcclWork::settle_finished(EventPool& pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (settled_) return;
  settled_state_ = cudaSuccess;
  settled_ = true;
  for (const auto& [device, e] : events_) pool.give_back(device, e);
  events_.clear();
}

bool NcclWork::poll() {
  // Errors are the watchdog's to report (it names the op and aborts the communicators).
  if (query() != cudaSuccess) return false;
  finish();
  return true;
}

}  // namespace tutti::nccl_backend
