#include "tutti/work.h"

#include <algorithm>
#include <new>

#include "tutti/error.h"

namespace tutti {
namespace {

// A blocking call makes a completed Work and its caller usually drops it at once: its block (the
// shared_ptr's control block with the Work inside) goes to a small per-thread cache for the next
// call instead of back to malloc (malloc and free were a tenth of a blocking call's cost).
struct BlockCache {
  static constexpr int kMax = 8;
  void* blocks[kMax];
  size_t size = 0;  // of each cached block
  int count = 0;
  bool gone = false;  // the thread is ending: blocks go straight back to the heap
  ~BlockCache() {
    gone = true;
    for (int i = 0; i < count; ++i) ::operator delete(blocks[i]);
    count = 0;
  }
};
thread_local BlockCache block_cache;

template <typename T>
struct CachingAllocator {
  using value_type = T;
  CachingAllocator() = default;
  template <typename U>
  CachingAllocator(const CachingAllocator<U>&) {}  // NOLINT(runtime/explicit)
  T* allocate(size_t n) {
    BlockCache& c = block_cache;
    const size_t bytes = n * sizeof(T);
    if (!c.gone && c.count > 0 && c.size == bytes) return static_cast<T*>(c.blocks[--c.count]);
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) {
    BlockCache& c = block_cache;
    const size_t bytes = n * sizeof(T);
    if (!c.gone && c.count < BlockCache::kMax && (c.count == 0 || c.size == bytes)) {
      c.size = bytes;
      c.blocks[c.count++] = p;
      return;
    }
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const CachingAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CachingAllocator<U>&) const {
    return false;
  }
};

}  // namespace

Work::Work(OpContext ctx) : ctx_(std::move(ctx)) {}

Work::~Work() {
  delete sync_.load(std::memory_order_acquire);
}

std::shared_ptr<Work> Work::completed(const OpContext& ctx) {
  return completed(OpContext(ctx));
}

std::shared_ptr<Work> Work::completed(OpContext&& ctx) {
  auto work = std::allocate_shared<Work>(CachingAllocator<Work>(), std::move(ctx));
  work->done_.store(true, std::memory_order_release);
  return work;
}

Work::Sync& Work::sync() {
  Sync* s = sync_.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  auto* fresh = new Sync();
  if (sync_.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread made it first: s holds it
  return *s;
}

bool Work::is_completed() {
  if (done_.load(std::memory_order_acquire)) return true;
  // True once poll() sees the op done, even while another thread still runs its hooks (NCCL's
  // watchdog): a later op waited on the same stream makes the earlier complete at once.
  return poll();
}

bool Work::is_success() {
  return is_completed() && exception() == nullptr;
}

std::exception_ptr Work::exception() {
  if (!is_completed()) return nullptr;
  Sync* s = sync_.load(std::memory_order_acquire);
  if (s == nullptr) return nullptr;  // complete when made, or finished without an error
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->error;
}

void Work::keep_alive(std::shared_ptr<const void> object) {
  Sync& s = sync();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.keep_alive.push_back(std::move(object));
}

void Work::finish(std::exception_ptr error) {
  Sync& s = sync();
  std::function<void(const std::exception_ptr&)> hook;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (done_.load(std::memory_order_relaxed) || s.finishing) return;
    s.finishing = true;
    s.error = error;
    hook = std::move(s.hook);
    s.hook = nullptr;
  }
  // The hooks run before any waiter wakes: a caller whose wait() returned sees their effect (the
  // group is marked aborted). A hook added while they run (on_finish from another thread) runs
  // here after them, not never.
  // The hooks that ran are destroyed on return, as before (what they hold may be this Work's
  // last other reference, or its group's).
  std::function<void(const std::exception_ptr&)> ran;
  std::vector<std::function<void(const std::exception_ptr&)>> ran_late;
  while (true) {
    if (hook) {
      hook(error);
      if (ran) {
        ran_late.push_back(std::move(hook));
      } else {
        ran = std::move(hook);
      }
    }
    std::lock_guard<std::mutex> lock(s.mutex);
    hook = std::move(s.hook);
    s.hook = nullptr;
    if (!hook) {
      done_.store(true, std::memory_order_release);
      break;
    }
  }
  s.cv.notify_all();
}

void Work::on_finish(std::function<void(const std::exception_ptr&)> hook) {
  Sync& s = sync();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!done_.load(std::memory_order_relaxed)) {
      if (s.hook) {
        s.hook = [first = std::move(s.hook), then = std::move(hook)](const std::exception_ptr& e) {
          first(e);
          then(e);
        };
      } else {
        s.hook = std::move(hook);
      }
      return;
    }
    error = s.error;
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
  if (done_.load(std::memory_order_acquire) && sync_.load(std::memory_order_acquire) == nullptr) {
    return;  // complete when made
  }
  Sync& s = sync();
  const auto deadline =
      bounded ? deadline_after(timeout) : std::chrono::steady_clock::time_point::max();
  const auto interval = poll_interval();
  while (!is_completed()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout,
                  description() + " is still running after waiting " +
                      std::to_string(timeout.count()) + " ms (the op itself times out after " +
                      std::to_string(ctx_.timeout.count()) + " ms; the group is unaffected)");
    }
    // Sleep until finished, the deadline, or the next poll; at most a second at a time, so a
    // deadline far away never reaches the clock's limits.
    std::chrono::steady_clock::duration nap = std::chrono::seconds(1);
    if (interval.count() > 0) nap = std::min<std::chrono::steady_clock::duration>(nap, interval);
    if (bounded) nap = std::min(nap, deadline - std::chrono::steady_clock::now());
    std::unique_lock<std::mutex> lock(s.mutex);
    if (done_.load(std::memory_order_relaxed)) break;
    if (nap.count() > 0) s.cv.wait_for(lock, nap);
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.error) std::rethrow_exception(s.error);
}

}  // namespace tutti
