// For language bindings that hold a lock of their own while tutti's objects are destroyed
// (Python's GIL): hooks tutti calls around a teardown that may wait, on the thread that runs it.
//
//   tutti::set_blocking_hooks({&release_my_lock, &take_my_lock_back});
//
// A group's destroy() (from its destructor too) waits for its worker, its backend's threads
// and its store (up to 2 s a request where the store's host has gone); an agent's destructor
// for its threads and serving connections (up to 5 s). Where the last reference to one of them
// goes from the binding's own code (the object its language collects), the binding cannot
// release its lock around that itself: `enter` runs before such a wait and `leave` after it,
// with what `enter` returned. C++ callers need none of this.
//
// A binding that lets go of its lock there must not hold another lock of its own across the
// drop that a thread holding the first may wait for (the two threads would wait for each other).
#pragma once

#include "tutti/export.h"

namespace tutti {

struct BlockingHooks {
  // Returns what `leave` gets back (nullptr: nothing to give back, e.g. the calling thread did
  // not hold the lock). Called on the thread that destroys the object; must not throw.
  void* (*enter)() = nullptr;
  void (*leave)(void* token) = nullptr;
};

// Installs `hooks` for the whole process, replacing any before (both null: none, the default;
// one without the other is refused, kInvalidArgument). Thread-safe; a teardown already past its
// `enter` calls the `leave` it began with.
TUTTI_API void set_blocking_hooks(BlockingHooks hooks);

namespace detail {

// Runs the hooks over its lifetime (no-ops while none is installed).
class TUTTI_API BlockingScope {
 public:
  BlockingScope();
  ~BlockingScope();
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;

 private:
  void (*leave_)(void*) = nullptr;
  void* token_ = nullptr;
};

}  // namespace detail
}  // namespace tutti
