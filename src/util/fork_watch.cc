#include "util/fork_watch.h"

#include <pthread.h>

#include <atomic>
#include <vector>

namespace tutti::detail {
namespace {

std::atomic<uint64_t> g_generation{0};

// Runs in the child right after fork(): only async-signal-safe work here.
void on_fork_child() {
  g_generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t fork_generation() {
  static const bool installed = [] {
    ::pthread_atfork(nullptr, nullptr, on_fork_child);
    return true;
  }();
  static_cast<void>(installed);
  return g_generation.load(std::memory_order_relaxed);
}

}  // namespace tutti::detail

namespace tutti::detail {

void keep_forever(std::shared_ptr<const void> object) {
  // A spin lock, not a mutex: a mutex a parent thread held at the fork would stay locked here.
  // Leaked on purpose, reachable from this static: nothing of it may be destroyed at exit.
  static std::atomic_flag busy = ATOMIC_FLAG_INIT;
  static auto* kept = new std::vector<std::shared_ptr<const void>>();
  while (busy.test_and_set(std::memory_order_acquire)) {
  }
  kept->push_back(std::move(object));
  busy.clear(std::memory_order_release);
}

}  // namespace tutti::detail
