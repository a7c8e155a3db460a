#include "util/fork_watch.h"

#include <pthread.h>

#include <atomic>

namespace tutti::detail {
namespace {

std::atomic<uint64_t> g_generation{0};

// Runs in the child right after fork(): only async-signal-safe work here.
void on_fork_child() { g_generation.fetch_add(1, std::memory_order_relaxed); }

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
