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

namespace tutti::detail {

// The number of forks between the first process and this one (0 in a process never forked
// into). Installs the fork handler on first use; thread-safe and cheap (one atomic load).
uint64_t fork_generation();

}  // namespace tutti::detail
