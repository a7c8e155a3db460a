// NcclWork: the Work of one NCCL op, done when the completion events recorded after it on each
// of its streams have fired; and the pool those events come from (internal to the nccl backend).
//
// Who finishes it: the backend's watchdog (every op, when its events fire, when it misses its
// deadline, or when the communicators fail), abort and destroy (every op still pending, with
// kAborted), and any thread asking is_completed() or waiting (poll(): a non-blocking query of
// the events, every poll_interval()). Whichever comes first wins (Work::finish runs once).
//
// The events belong to the backend's EventPool: the backend gives them back (settle) before it
// lets go of a Work, and always before it is destroyed, so a Work that outlives its
// backend holds no CUDA handle. Threads: every method may be called from any thread; the events
// are queried and given back under one mutex, so a query never meets a handle given back.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "tutti/work.h"

namespace tutti::nccl_backend {

// Completion events, reused from op to op (review #21: creating and destroying two events per
// device per op costs more than the op at small sizes). Thread-safe.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool();  // destroys every event given back (CUDA frees a pending one once it fires)

  // An event of `device`, which must be the calling thread's current device. Throws
  // Error(kInternal) when CUDA cannot make one.
  cudaEvent_t take(int device);
  void give_back(int device, cudaEvent_t event);

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudaEvent_t>> free_;  // by device
};

class NcclWork : public Work {
 public:
  explicit NcclWork(OpContext ctx) : Work(std::move(ctx)) {}
  ~NcclWork() override;

  // Before the Work is shared: an event recorded after the op on one of its streams.
  void add_event(int device, cudaEvent_t event);
  // Non-blocking: cudaSuccess once every event has fired, cudaErrorNotReady while one has not,
  // or the first CUDA error an event reports; once settled, what settle() saw.
  cudaError_t query();
  // Queries the events one last time and gives them back to `pool`; from then on query()
  // answers what this saw. Returns that. The backend settles a Work before it finishes it, so
  // that poll() can never report success for an op the backend ends with an error.
  cudaError_t settle(EventPool& pool);
  // settle() for a Work known to have finished without an error (a blocking op its caller saw
  // finish): no query of the events, which cost a driver call each.
  void settle_finished(EventPool& pool);

 protected:
  bool poll() override;
  // An op on one GPU takes a few microseconds: wait() checks the events this often.
  std::chrono::microseconds poll_interval() const override { return std::chrono::microseconds(20); }

 private:
  cudaError_t query_locked() const;

  std::mutex mutex_;
  std::vector<std::pair<int, cudaEvent_t>> events_;  // (device, event)
  bool settled_ = false;
  cudaError_t settled_state_ = cudaErrorNotReady;
};

}  // namespace tutti::nccl_backend
