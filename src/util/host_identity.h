// Which machine this process runs on (internal, shared by the core and the CPU backends; each
// library that uses it links its own copy, from tutti_util: it is no part of libtutti's ABI).
#pragma once

#include <cstdint>
#include <string>

namespace tutti::detail {

// "<hostname>/<boot id>": equal for two processes exactly when they share a running kernel
// (and so can share memory); a host name alone can repeat across machines or containers.
// TUTTI_HOST_ID, when set, replaces it (containers sharing a kernel but not /dev/shm).
std::string host_identity();

// When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat), as this
// host's /proc shows it; 0 when no such process is visible or it has exited (a zombie its parent
// has not reaped yet). A pid and its start time name one process: a pid reused later has a later
// start time.
uint64_t process_start_time(long pid);

// This process's pid namespace (the inode of /proc/self/ns/pid), or 0 where it cannot be read.
// Two processes of one host see each other's pids only within one namespace: a pid taken from
// another process means something here only where both say the same.
uint64_t pid_namespace();

}  // namespace tutti::detail
