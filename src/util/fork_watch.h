// Which process a group belongs to, across fork() (internal to the core).
//
// A forked child inherits its parent's groups as memory only: their threads did not follow it,
// and their sockets, shared-memory segment and store connection are the parent's. Every group
// records the fork generation it was created in; a pthread_atfork child handler advances the
// generation, so in a child every inherited group reads as forked and is refused (ops fail with
// kInvalidUsage; destroy and the exit hook leave its resources to the parent). Groups the child
// creates itself work as usual.
#pragma once

#include <cstdint>
#include <memory>

namespace tutti::detail {

// Keeps `object` alive until the process ends, reachable (so leak checkers see no leak): what a
// forked child inherited of its parent's groups and agents, which it must neither use nor tear
// down (their threads and locks are the parent's). Thread-safe.
void keep_forever(std::shared_ptr<const void> object);

// The number of forks between the first process and this one (0 in a process never forked
// into). Installs the fork handler on first use; thread-safe and cheap (one atomic load).
uint64_t fork_generation();

}  // namespace tutti::detail
