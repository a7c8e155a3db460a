#include "group/op_queue.h"

namespace tutti::detail {

void OpQueue::push(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    if (!worker_.joinable()) {
      stopping_ = false;
      worker_ = std::thread([this] { loop(); });
    }
  }
  wake_.notify_one();
}

void OpQueue::stop() {
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    worker = std::move(worker_);
  }
  wake_.notify_one();
  if (worker.joinable()) worker.join();
}

void OpQueue::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace tutti::detail
