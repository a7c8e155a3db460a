#include "tutti/work.h"

#include <algorithm>

#include "tutti/error.h"

namespace tutti {

Work::Work(OpContext ctx) : ctx_(std::move(ctx)) {}

Work::~Work() = default;

std::shared_ptr<Work> Work::completed(OpContext ctx) {
  auto work = std::make_shared<Work>(std::move(ctx));
  work->done_.store(true, std::memory_order_release);
  return work;
}

bool Work::is_completed() {
  if (done_.load(std::memory_order_acquire)) return true;
  return poll();
}

bool Work::is_success() { return is_completed() && exception() == nullptr; }

std::exception_ptr Work::exception() {
  if (!is_completed()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::keep_alive(std::shared_ptr<const void> object) {
  std::lock_guard<std::mutex> lock(mutex_);
  keep_alive_.push_back(std::move(object));
}

void Work::finish(std::exception_ptr error) {
  std::function<void(const std::exception_ptr&)> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    error_ = error;
    hook = std::move(hook_);
    hook_ = nullptr;
  }
  // The hook runs before any waiter wakes: a caller whose wait() returned sees its effect (the
  // group is marked aborted).
  if (hook) hook(error);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void Work::on_finish(std::function<void(const std::exception_ptr&)> hook) {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      hook_ = std::move(hook);
      return;
    }
    error = error_;
  }
  hook(error);
}

void Work::wait(std::chrono::milliseconds timeout) {
  const bool bounded = timeout != kUseGroupTimeout;
  if (bounded && timeout.count() < 0) {
    throw Error(ErrorCode::kInvalidArgument, "wait for " + description() +
                                                 ": timeout must not be negative, got " +
                                                 std::to_string(timeout.count()) + " ms");
  }
  const auto deadline = bounded ? deadline_after(timeout) : std::chrono::steady_clock::time_point::max();
  const auto interval = poll_interval();
  while (!is_completed()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout,
                  description() + " is still running after waiting " +
                      std::to_string(timeout.count()) +
                      " ms (the op itself times out after " + std::to_string(ctx_.timeout.count()) +
                      " ms; the group is unaffected)");
    }
    // Sleep until finished, the deadline, or the next poll; at most a second at a time, so a
    // deadline far away never reaches the clock's limits.
    std::chrono::steady_clock::duration nap = std::chrono::seconds(1);
    if (interval.count() > 0) nap = std::min<std::chrono::steady_clock::duration>(nap, interval);
    if (bounded) nap = std::min(nap, deadline - std::chrono::steady_clock::now());
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) break;
    if (nap.count() > 0) cv_.wait_for(lock, nap);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace tutti
