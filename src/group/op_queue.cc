#include "group/op_queue.h"

namespace tutti::detail {

thread_local const OpQueue::Shared* OpQueue::current_ = nullptr;

void OpQueue::push(std::function<void()> task) {
  Shared& sh = *shared_;
  {
    std::lock_guard<std::mutex> lock(sh.mutex);
    sh.tasks.push_back(std::move(task));
    if (!worker_.joinable()) {
      sh.stopping = false;
      const uint64_t generation = ++sh.generation;
      worker_ = std::thread([shared = shared_, generation] { loop(shared, generation); });
    }
  }
  sh.wake.notify_all();
}

void OpQueue::stop() {
  Shared& sh = *shared_;
  std::thread worker;
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(sh.mutex);
    sh.stopping = true;
    worker = std::move(worker_);
    // On the worker, its generation ends now, with the lock held: a push from here on starts a
    // worker of the next one, which this one leaves alone.
    here = worker.joinable() && worker.get_id() == std::this_thread::get_id();
    if (here) ++sh.generation;
  }
  sh.wake.notify_all();
  if (!worker.joinable()) return;
  if (!here) {
    worker.join();
    return;
  }
  // On the worker, inside a task: joining would wait for itself. What is queued behind the
  // task runs here, in order; the thread then ends once the task returns (a later push starts
  // a worker of a new generation, which the old one leaves alone).
  // (A task pushed meanwhile that a new worker took is run there, not here.)
  while (true) {
    std::function<void()> next;
    {
      std::lock_guard<std::mutex> lock(sh.mutex);
      if (sh.tasks.empty() || worker_.joinable()) break;
      next = std::move(sh.tasks.front());
      sh.tasks.pop_front();
    }
    next();
  }
  worker.detach();
}

void OpQueue::loop(const std::shared_ptr<Shared>& shared, uint64_t generation) {
  Shared& sh = *shared;
  current_ = &sh;
  std::unique_lock<std::mutex> lock(sh.mutex);
  while (true) {
    sh.wake.wait(lock,
                 [&] { return sh.generation != generation || sh.stopping || !sh.tasks.empty(); });
    if (sh.generation != generation || sh.tasks.empty()) return;  // replaced, or done
    std::function<void()> task = std::move(sh.tasks.front());
    sh.tasks.pop_front();
    lock.unlock();
    task();
    // Its captures go before the lock is taken again: the last reference to the group (a Work's
    // keep_alive) may be among them, and its destruction stops this queue.
    task = nullptr;
    lock.lock();
  }
}

}  // namespace tutti::detail
