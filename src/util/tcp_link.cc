#include "util/tcp_link.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "util/logging.h"

namespace tutti::detail {

std::chrono::milliseconds link_timeout() {
  static const std::chrono::milliseconds value = [] {
    constexpr long kDefault = 15000;
    const char* text = std::getenv("TUTTI_LINK_TIMEOUT_MS");
    if (text == nullptr || *text == '\0') return std::chrono::milliseconds(kDefault);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) {
      TUTTI_LOG_WARN("TUTTI_LINK_TIMEOUT_MS='{}' is not a number of milliseconds >= 0: {} ms",
                     text, kDefault);
      return std::chrono::milliseconds(kDefault);
    }
    if (v == 0) return std::chrono::milliseconds(0);
    // At most a day: the kernel's keepalive idle time is at most 32767 s.
    return std::chrono::milliseconds(std::clamp<long long>(v, 1000, 32767000));
  }();
  return value;
}

namespace {

bool is_tcp(int fd) {
  int domain = 0;
  socklen_t len = sizeof(domain);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) return false;
  if (domain != AF_INET && domain != AF_INET6) return false;
  int protocol = 0;
  len = sizeof(protocol);
  return ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 &&
         protocol == IPPROTO_TCP;
}

}  // namespace

void watch_link(int fd) {
  const long bound_s = static_cast<long>(link_timeout().count() / 1000);
  if (bound_s == 0 || !is_tcp(fd)) return;
  // The first probe after a third of the bound without a word from the peer, then one every
  // sixth; the kernel gives up after `count` unanswered ones, at about the bound.
  const int idle = static_cast<int>(std::max(1L, bound_s / 3));
  const int interval = static_cast<int>(std::max(1L, bound_s / 6));
  const int count = static_cast<int>(std::max(1L, (bound_s - idle + interval - 1) / interval));
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

long link_silent_ms(int fd) {
  if (link_timeout().count() == 0) return 0;
  tcp_info info{};
  socklen_t len = sizeof(info);
  // Fails (ENOPROTOOPT, EOPNOTSUPP) for Unix sockets: nothing to watch there.
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0;
  if (info.tcpi_state != TCP_ESTABLISHED && info.tcpi_state != TCP_CLOSE_WAIT) return 0;
  // The peer owes an answer: segments sent, not acknowledged and sent again at least once (a
  // live peer's ACK comes within a round trip), or two probes (a zero window's, keepalive's) in a
  // row unanswered (an ACK resets the count, so a peer that is alive but not reading, whose
  // window stays shut, never gets there). tcpi_last_ack_recv is how long since its last answer.
  const bool owed = (info.tcpi_unacked > 0 && info.tcpi_retransmits > 0) || info.tcpi_probes >= 2;
  return owed ? static_cast<long>(info.tcpi_last_ack_recv) : 0;
}

bool link_cut(int fd) {
  const auto bound = link_timeout().count();
  return bound > 0 && link_silent_ms(fd) > bound;
}

std::string link_cut_text(long silent_ms) {
  const std::string bound = std::to_string(link_timeout().count());
  return "its host has answered nothing for " +
         (silent_ms > 0 ? std::to_string(silent_ms) : bound) +
         " ms (TUTTI_LINK_TIMEOUT_MS=" + bound + "): the link or the host is gone";
}

}  // namespace tutti::detail
