// OpQueue: the worker thread that runs a group's async ops, one at a time, in issue order
// (internal to the core). Started on the first push; stop() joins it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
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
  void stop();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace tutti::detail
