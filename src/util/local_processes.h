// The processes of this user that run tutti groups on this kernel, whatever host id, network
// namespace or group they belong to (internal).
//
// Why: whether a rank may spin while it waits depends on how many processes compete for its
// CPUs, and a group sees only its own ranks. Two "hosts" of two ranks each in network namespaces
// on a 2-CPU machine are four processes on two CPUs: a rank spinning for its shm peer starved
// the other host's leader that it waited for through Gloo (4-8 ms per 8-byte allreduce, the
// slow regime of the cross-host comparison). So every process that creates a group registers
// once, and the shm backend counts the registered processes that may run on its ranks' CPUs.
//
// The table is /dev/shm/tutti-processes.<uid> (mode 0600): a slot per process (pid, start time,
// affinity mask), claimed with a compare-and-swap, left behind at exit and reused once its
// process is gone (its pid and start time no longer match /proc). Where the table cannot be
// opened, only this process counts.
#pragma once

#include <sched.h>

#include <vector>

namespace tutti::detail {

// Registers the calling process (once per process; again after a fork). Never throws.
void register_local_process() noexcept;

// The registered processes, alive, other than this one, that may run on at least one CPU of
// `cpus` (their pids).
std::vector<long> local_processes(const cpu_set_t& cpus);

// How many processes compete for `cpus`: those, and this one (registered or not).
int count_local_processes(const cpu_set_t& cpus) noexcept;

}  // namespace tutti::detail
