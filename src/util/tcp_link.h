// A TCP link that stops answering (internal, shared by the core and the CPU backends).
//
// A peer host that is cut off (a cable pulled, a host powered off, a NAT that forgot the flow)
// sends no reset: without help, the kernel sees it only after ~15 minutes of retransmissions, or
// never on a connection that waits idle. Two watches bound it by TUTTI_LINK_TIMEOUT_MS (default
// 15000; 0 turns both off):
// - keepalive on every TCP connection tutti makes or accepts: an idle connection whose peer host
//   answers no probe fails with ETIMEDOUT within the bound;
// - link_silent_ms(), which a wait that sleeps asks between its slices: a connection with bytes
//   or probes unanswered and no ACK for longer than the bound is cut.
// TCP_USER_TIMEOUT is not used: it also ends a connection whose peer is alive but not reading
// (a zero window it keeps answering probes for), which is a rank that is merely late.
#pragma once

#include <chrono>
#include <string>

namespace tutti::detail {

// The bound (TUTTI_LINK_TIMEOUT_MS, read once; a value that is not a number, or negative, warns
// and keeps the default; under 1000 is taken as 1000, the kernel's keepalive counting in seconds).
std::chrono::milliseconds link_timeout();

// Keepalive on a TCP socket, timed to fail within link_timeout() of the peer's last answer.
// Nothing for other sockets, or when the bound is 0.
void watch_link(int fd);

// How long (ms) a TCP connection has had data or probes outstanding without any answer from the
// peer; 0 when nothing is outstanding, for other sockets, and when the bound is 0.
long link_silent_ms(int fd);

// Whether link_silent_ms(fd) has passed the bound.
bool link_cut(int fd);

// "its host has answered nothing for N ms (TUTTI_LINK_TIMEOUT_MS=T): the link or the host is
// gone", for a connection link_cut() found, or one that failed with ETIMEDOUT.
std::string link_cut_text(long silent_ms);

}  // namespace tutti::detail
