// The time an op starts and ends, read cheaply (internal).
//
// Every op reads the steady clock twice on its fast path: when it is issued (its deadline counts
// from there) and when it ends (the flight recorder's entry). clock_gettime() costs ~30 ns on
// the VMs this runs on and orders the pipeline around it; at world size 1 the two reads were
// half of an 8-byte allreduce's ~220 ns in the core. op_now() reads the time stamp counter
// instead (~12 ns, not serialising) and converts it with a rate measured against the steady
// clock: once per process over 200 us (the first call: a group's creation makes it, off any
// op's path), then by each thread over each interval between its anchors. A thread takes a
// fresh (counter, steady) anchor every millisecond, so what op_now() returns stays within about
// a microsecond of steady_clock::now() (typically tens of nanoseconds) and every error is
// limited to one interval. It is not monotonic: a fresh anchor may read a little before the last
// extrapolated time (by that error). A thread's rate more than 1% from the process's is refused
// (a suspend, a slewed clock's step); the clock is read until the next interval measures it,
// and eight such rates in a row that agree replace the process's (which was misjudged). Where
// the counter cannot be trusted (not x86-64, or the kernel does not keep its own clock on it, e.g.
// an unstable TSC), op_now() is steady_clock::now().
#pragma once

#include <chrono>

namespace tutti::detail {

// The steady clock's time now, within about a microsecond. For deadlines and records of ops, not
// for measurements finer than that.
std::chrono::steady_clock::time_point op_now();

// Whether op_now() reads the time stamp counter here (else it is steady_clock::now()).
bool op_clock_uses_counter();
// Whether this thread's op_now() now extrapolates from its anchor (its common path), for tests.
bool op_clock_extrapolates();
// The rate every thread's first anchor trusts (ns per counter tick; 0: none), and, for tests,
// setting it.
double op_clock_process_rate();
void op_clock_set_process_rate(double ns_per_tick);

}  // namespace tutti::detail
