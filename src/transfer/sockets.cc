// The direct transport's sockets (transfer/channel.h): abstract Unix sockets between the agents
// of one host, TCP across hosts; connects are non-blocking and bounded by their deadline.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "transfer/channel.h"
#include "tutti/error.h"
#include "util/tcp_link.h"

namespace tutti::detail {
namespace {

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  addr.sun_path[0] = '\0';  // abstract: no file system entry
  std::memcpy(addr.sun_path + 1, name.data(), n);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

// Waits for a non-blocking connect; throws kIoError/kTimeout, or kAborted once `cancelled`
// (looked at every 20 ms: a peer that drops the SYNs answers nothing until the deadline).
void finish_connect(int fd, Clock::time_point deadline, const std::string& what,
                    const std::atomic<bool>* cancelled) {
  const int64_t slice_ms = cancelled != nullptr ? 20 : 1000;
  while (true) {
    if (cancelled != nullptr && cancelled->load()) {
      ::close(fd);
      throw Error(ErrorCode::kAborted, what + ": cancelled");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      ::close(fd);
      throw Error(ErrorCode::kTimeout, what + ": no answer before the deadline");
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, slice_ms)));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      ::close(fd);
      errno = error;
      io_error(what);
    }
    return;
  }
}

}  // namespace

bool hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

int listen_unix(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) io_error("socket");
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 128) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    io_error("listening on @" + name);
  }
  return fd;
}

int connect_unix(const std::string& name, Clock::time_point deadline,
                 const std::atomic<bool>* cancelled) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) io_error("socket");
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  // EAGAIN on a Unix socket: the listener's backlog is full (it is busy, or stopped) and the
  // socket is not connected (poll says writable at once): try again until the deadline, every
  // 1 ms at first, then less often.
  auto pause = std::chrono::milliseconds(1);
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno == EINTR) continue;
    if (errno == EISCONN) break;  // an interrupted try that went through
    if (errno == EINPROGRESS || errno == EALREADY) {
      finish_connect(fd, deadline, "connecting to @" + name, cancelled);
      return fd;
    }
    if (errno != EAGAIN) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      io_error("connecting to @" + name);
    }
    if (cancelled != nullptr && cancelled->load()) {
      ::close(fd);
      throw Error(ErrorCode::kAborted, "connecting to @" + name + ": cancelled");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      ::close(fd);
      throw Error(ErrorCode::kTimeout, "connecting to @" + name +
                                           ": its backlog stayed full until the deadline (the "
                                           "owner accepts no connection)");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return fd;
}

int listen_tcp(const std::string& host, uint16_t& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* info = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &info) != 0 ||
      info == nullptr) {
    throw Error(ErrorCode::kIoError, "cannot resolve '" + host + "' to listen on");
  }
  const int fd = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
      ::bind(fd, info->ai_addr, info->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const int saved = errno;
    ::freeaddrinfo(info);
    if (fd >= 0) ::close(fd);
    errno = saved;
    io_error("listening on " + host + ":" + service);
  }
  ::freeaddrinfo(info);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

int connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
                const std::atomic<bool>* cancelled) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  const std::string service = std::to_string(port);
  const std::string where = host + ":" + service;
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &info) != 0 || info == nullptr) {
    throw Error(ErrorCode::kIoError, "cannot resolve " + where);
  }
  const int fd = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    ::freeaddrinfo(info);
    io_error("socket");
  }
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  watch_link(fd);  // an owner's host cut off fails the connection within the bound
  const int rc = ::connect(fd, info->ai_addr, info->ai_addrlen);
  const int saved = errno;
  ::freeaddrinfo(info);
  if (rc != 0) {
    if (saved != EINPROGRESS) {
      ::close(fd);
      errno = saved;
      io_error("connecting to " + where);
    }
    finish_connect(fd, deadline, "connecting to " + where, cancelled);
  }
  return fd;
}

}  // namespace tutti::detail
