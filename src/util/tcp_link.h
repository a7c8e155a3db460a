// A TCP link that stops answering (internal, shared by the core and the CPU backends).
//
// A peer host that is cut off (a cable pulled, a host powered off, a NAT that forgot the flow)
// sends no reset: without help, the kernel sees it only after ~15 minutes of retransmissions, or
// never on a connection that waits idle. Two watches bound it by TUTTI_LINK_TIMEOUT_MS (default
// 15000; 0 turns both off):
// - keepalive (watch_link()) on the TCP connections of Gloo's pairs, the direct transport and
//   the TCP store: an idle connection whose peer host answers no probe fails with ETIMEDOUT
//   within the bound;
// - LinkWatch, which a wait that sleeps asks between its slices: a connection with bytes or probes
//   unanswered and nothing heard from the peer for longer than the bound is cut.
// TCP_USER_TIMEOUT is not used: it also ends a connection whose peer is alive but not reading
// (a zero window it keeps answering probes for), which is a rank that is merely late.
// Not bounded: a link cut while this side's window probes wait out a long backoff (the peer had
// not read for minutes), seen at the next unanswered probe (at most ~2 minutes later).
#pragma once

#include <chrono>
#include <string>

namespace tutti::detail {

// The bound (TUTTI_LINK_TIMEOUT_MS, read once per library; a value that is not a number, or
// negative, warns and keeps the default; under 1000 is taken as 1000 and over 32767000 as that,
// the kernel's keepalive counting in whole seconds up to 32767).
std::chrono::milliseconds link_timeout();

// Keepalive on a TCP socket, timed to fail within link_timeout() (whole seconds, rounded down;
// 2 s for a bound under 2 s) of the peer's last word. Nothing for other sockets, or when the
// bound is 0.
void watch_link(int fd);

// How long (ms) a TCP connection has heard nothing from its peer while the peer owes an answer
// (bytes sent again unacknowledged, or a probe unanswered); 0 when it owes none, for other
// sockets, and when the bound is 0.
long link_silent_ms(int fd);

// One connection's watch, for a wait that looks again and again: cut() is true once the link has
// been silent past the bound at two looks at least 200 ms apart (a probe sent just before a look
// is answered within a round trip: one look alone could take that for silence).
class LinkWatch {
 public:
  // Whether `fd`'s link is cut; `silent_ms` gets how long it has been silent.
  bool cut(int fd, long& silent_ms);
  // Silent past the bound at the last look, not yet at two: the next look is due in 200 ms.
  bool suspect() const { return first_seen_ != std::chrono::steady_clock::time_point{}; }
  static constexpr std::chrono::milliseconds kSecondLook{200};

 private:
  std::chrono::steady_clock::time_point first_seen_{};
};

// "its host has answered nothing for N ms (TUTTI_LINK_TIMEOUT_MS=T): the link or the host is
// gone", for a connection LinkWatch found cut (N: its silence), or one whose keepalive failed
// with ETIMEDOUT (silent_ms 0: the bound); strerror(ETIMEDOUT) when the bound is 0.
std::string link_cut_text(long silent_ms);

// The words for errno `err` of a connection made: link_cut_text(0) for ETIMEDOUT (its keepalive
// probes went unanswered), strerror otherwise.
std::string socket_error_text(int err);

}  // namespace tutti::detail
