// OpQueue: the worker thread that runs a group's async ops, one at a time, in issue order
// (internal to the core). Started on the first push; stop() joins it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace tutti::detail {

class OpQueue {
 public:
  OpQueue() = default;
  ~OpQueue() { stop(); }
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Runs task() on the worker after every task pushed before it. Tasks must not throw.
  void push(std::function<void()> task);
  // Runs what is queued, then ends the worker and joins it. Later pushes start it again.
  // Called on the worker itself (a task's completion hook destroys the group, or drops its last
  // reference): runs what is queued on the spot and lets the worker end by itself, touching
  // nothing of this queue once the task it is in returns (the queue may be gone by then).
  void stop();
  // Whether the calling thread is this queue's worker (running a task, or a hook inside one).
  bool on_worker() const { return current_ == shared_.get(); }

 private:
  // What the worker touches: its own reference keeps it alive past the queue.
  struct Shared {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
    uint64_t generation = 0;  // the current worker's; an older one ends after its task
  };
  static void loop(const std::shared_ptr<Shared>& shared, uint64_t generation);

  static thread_local const Shared* current_;  // the queue whose worker this thread is
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::thread worker_;  // guarded by shared_->mutex
};

}  // namespace tutti::detail
