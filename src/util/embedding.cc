// set_blocking_hooks and the scope that runs them (include/tutti/embedding.h).
#include "tutti/embedding.h"

#include <mutex>
#include <string>

#include "tutti/error.h"

namespace tutti {
namespace {

std::mutex g_mutex;
BlockingHooks g_hooks;  // under g_mutex: a scope takes both of one installation

BlockingHooks installed() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_hooks;
}

}  // namespace

void set_blocking_hooks(BlockingHooks hooks) {
  if ((hooks.enter == nullptr) != (hooks.leave == nullptr)) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("set_blocking_hooks: ") + (hooks.enter == nullptr ? "leave" : "enter") +
                    " given without " + (hooks.enter == nullptr ? "enter" : "leave") +
                    ": both or neither");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_hooks = hooks;
}

namespace detail {

BlockingScope::BlockingScope() {
  const BlockingHooks hooks = installed();  // (a teardown: a lock here costs nothing that counts)
  if (hooks.enter == nullptr) return;
  token_ = hooks.enter();
  leave_ = hooks.leave;
}

BlockingScope::~BlockingScope() {
  if (leave_ != nullptr && token_ != nullptr) leave_(token_);
}

}  // namespace detail
}  // namespace tutti
