#include "util/tcp_link.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

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
      TUTTI_LOG_WARN("TUTTI_LINK_TIMEOUT_MS='{}' is not a number of milliseconds >= 0: {} ms", text,
                     kDefault);
      return std::chrono::milliseconds(kDefault);
    }
    if (v == 0) return std::chrono::milliseconds(0);
    // At most ~9 h: the kernel's keepalive idle time is at most 32767 s.
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
  return ::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 && protocol == IPPROTO_TCP;
}

}  // namespace

void watch_link(int fd) {
  const long bound_s = static_cast<long>(link_timeout().count() / 1000);
  if (bound_s == 0 || !is_tcp(fd)) return;
  // A probe every sixth of the bound, three of them unanswered (fewer under 3 s), after an idle
  // time that makes the kernel give up at the bound at the latest: idle + count x interval <= it.
  const long interval = std::max(1L, bound_s / 6);
  const long idle = std::max(1L, bound_s - 3 * interval);
  const long count = std::clamp((bound_s - idle) / interval, 1L, 3L);
  const int values[] = {static_cast<int>(idle), static_cast<int>(interval),
                        static_cast<int>(count)};
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &values[0], sizeof(int));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &values[1], sizeof(int));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &values[2], sizeof(int));
}

long link_silent_ms(int fd) {
  if (link_timeout().count() == 0) return 0;
  tcp_info info{};
  socklen_t len = sizeof(info);
  // Fails (ENOPROTOOPT, EOPNOTSUPP) for Unix sockets: nothing to watch there.
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0;
  if (info.tcpi_state != TCP_ESTABLISHED && info.tcpi_state != TCP_CLOSE_WAIT) return 0;
  // The peer owes an answer: segments sent, unacknowledged and sent again (a live peer's ACK
  // comes within a round trip), or a probe (a zero window's, keepalive's) unanswered (an ACK
  // resets the count: a peer that is alive but not reading, whose window stays shut, answers
  // each). Silence is since the last thing heard from it, an ACK or data (the kernel does not
  // note ACKs of a connection that only receives).
  const bool owed = (info.tcpi_unacked > 0 && info.tcpi_retransmits > 0) || info.tcpi_probes > 0;
  if (!owed) return 0;
  return static_cast<long>(std::min(info.tcpi_last_ack_recv, info.tcpi_last_data_recv));
}

bool LinkWatch::cut(int fd, long& silent_ms) {
  const auto bound = link_timeout().count();
  silent_ms = link_silent_ms(fd);
  if (bound == 0 || silent_ms <= bound) {
    first_seen_ = {};
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  if (first_seen_ == std::chrono::steady_clock::time_point{}) first_seen_ = now;
  return now - first_seen_ >= kSecondLook;
}

std::string link_cut_text(long silent_ms) {
  const auto bound = link_timeout().count();
  if (bound == 0) return std::strerror(ETIMEDOUT);
  const std::string text = std::to_string(bound);
  return "its host has answered nothing for " + (silent_ms > 0 ? std::to_string(silent_ms) : text) +
         " ms (TUTTI_LINK_TIMEOUT_MS=" + text + "): the link or the host is gone";
}

std::string socket_error_text(int err) {
  return err == ETIMEDOUT ? link_cut_text(0) : std::string(std::strerror(err));
}

}  // namespace tutti::detail
