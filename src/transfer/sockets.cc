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
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

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

namespace {

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

std::vector<Address> addresses_of(const addrinfo* info) {
  std::vector<Address> out;
  for (const addrinfo* a = info; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Address one;
    std::memcpy(&one.storage, a->ai_addr, a->ai_addrlen);
    one.length = a->ai_addrlen;
    one.family = a->ai_family;
    out.push_back(one);
  }
  return out;
}

// A name's lookup, on a thread of its own: a name server that does not answer holds that thread
// (until getaddrinfo gives up), not the caller, who may have a deadline or be cancelled.
struct Lookup {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int rc = 0;
  std::vector<Address> found;
};

// Every address of host:service, in getaddrinfo's order. A numeric address at once; a name
// looked up until the deadline, and `cancelled` looked at every 20 ms.
std::vector<Address> resolve(const std::string& host, const std::string& service, int flags,
                             Clock::time_point deadline, const std::atomic<bool>* cancelled,
                             const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICHOST;
  addrinfo* info = nullptr;
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = ::getaddrinfo(node, service.c_str(), &hints, &info);
  if (rc == 0) {
    std::vector<Address> out = addresses_of(info);
    ::freeaddrinfo(info);
    if (out.empty())
      throw Error(ErrorCode::kIoError, "cannot resolve " + what + ": no address it can use");
    return out;
  }
  if (rc != EAI_NONAME) {
    const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
    throw Error(ErrorCode::kIoError, "cannot resolve " + what + ": " + why);
  }
  if (cancelled != nullptr && cancelled->load()) {
    throw Error(ErrorCode::kAborted, "resolving " + what + ": cancelled");
  }
  if (Clock::now() >= deadline) {
    throw Error(ErrorCode::kTimeout, "resolving " + what + ": no time was left to look it up");
  }
  hints.ai_flags = flags;
  // One lookup of a name at a time: callers that come while it runs (a consumer whose gets keep
  // timing out against a name server that never answers) wait for it rather than each leaving a
  // thread behind.
  static std::mutex running_mutex;
  static std::map<std::string, std::weak_ptr<Lookup>> running;
  const std::string key = host + '\0' + service + '\0' + std::to_string(flags);
  std::shared_ptr<Lookup> lookup;
  {
    std::lock_guard<std::mutex> guard(running_mutex);
    for (auto it = running.begin(); it != running.end();) {
      it = it->second.expired() ? running.erase(it) : std::next(it);
    }
    lookup = running[key].lock();
    if (lookup) {
      std::lock_guard<std::mutex> done_guard(lookup->mutex);
      if (lookup->done) lookup.reset();  // finished: its answer may be old, ask again
    }
    if (!lookup) {
      lookup = std::make_shared<Lookup>();
      try {
        std::thread([lookup, host, service, hints] {
          int result = EAI_MEMORY;
          std::vector<Address> out;
          try {
            addrinfo* found = nullptr;
            result = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
            if (result == 0) {
              std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, ::freeaddrinfo);
              out = addresses_of(found);
            }
          } catch (...) {  // out of memory for the addresses
            result = EAI_MEMORY;
          }
          std::lock_guard<std::mutex> lock(lookup->mutex);
          lookup->rc = result;
          lookup->found = std::move(out);
          lookup->done = true;
          lookup->done_cv.notify_all();
        }).detach();
      } catch (const std::system_error&) {
        throw Error(ErrorCode::kUnavailable,
                    "cannot resolve " + what + ": no thread to look it up");
      }
      running[key] = lookup;
    }
  }
  std::unique_lock<std::mutex> lock(lookup->mutex);
  while (!lookup->done) {
    if (cancelled != nullptr && cancelled->load()) {
      throw Error(ErrorCode::kAborted, "resolving " + what + ": cancelled");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw Error(ErrorCode::kTimeout,
                  "resolving " + what + ": the name service gave no answer before the deadline");
    }
    lookup->done_cv.wait_for(
        lock, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(20)));
  }
  if (lookup->rc != 0 || lookup->found.empty()) {
    throw Error(ErrorCode::kIoError,
                "cannot resolve " + what + ": " +
                    (lookup->rc != 0 ? ::gai_strerror(lookup->rc) : "no address it can use"));
  }
  return lookup->found;
}

std::string text_of(const Address& a) {
  char ip[INET6_ADDRSTRLEN] = {0};
  if (a.family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, ip,
                sizeof(ip));
    return ip;
  }
  if (a.family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, ip,
                sizeof(ip));
    return std::string("[") + ip + "]";
  }
  return "?";
}

}  // namespace

int listen_tcp(const std::string& host, uint16_t& port) {
  const std::string service = std::to_string(port);
  const std::string where = (host.empty() ? std::string("*") : host) + ":" + service;
  // A name's lookup bounded like a connect's (the agent's start has no deadline of its own).
  const std::vector<Address> addresses =
      resolve(host, service, AI_PASSIVE, Clock::now() + std::chrono::seconds(30), nullptr, where);
  // The first address that binds (a name may give an IPv6 address this host cannot bind first).
  int fd = -1;
  std::string failures;
  for (const Address& a : addresses) {
    fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    if (fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) == 0 &&
        ::bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) == 0 &&
        ::listen(fd, 128) == 0) {
      break;
    }
    const std::string why = std::strerror(errno);
    failures += (failures.empty() ? "" : "; ") + text_of(a) + ": " + why;
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (fd < 0) throw Error(ErrorCode::kIoError, "listening on " + where + ": " + failures);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

int connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
                const std::atomic<bool>* cancelled) {
  const std::string service = std::to_string(port);
  const std::string where = host + ":" + service;
  const std::vector<Address> addresses = resolve(host, service, 0, deadline, cancelled, where);
  // Each address in turn, the next when one fails. One that does not answer may take its share
  // of the time left (the last one all of it), so a dead first address leaves time for the rest.
  std::string failures;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const Address& a = addresses[i];
    const std::string at = addresses.size() > 1 ? where + " (" + text_of(a) + ")" : where;
    const auto now = Clock::now();
    const size_t left = addresses.size() - i;
    const Clock::time_point until =
        left == 1 || now >= deadline ? deadline : now + (deadline - now) / static_cast<int>(left);
    const int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {  // e.g. an IPv6 address where IPv6 is off: the next address
      const std::string why = "socket for " + at + ": " + std::strerror(errno);
      if (left == 1) {
        throw Error(ErrorCode::kIoError,
                    failures.empty() ? why : why + " (and before: " + failures + ")");
      }
      failures += (failures.empty() ? "" : "; ") + why;
      continue;
    }
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    watch_link(fd);  // an owner's host cut off fails the connection within the bound
    try {
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
        if (errno != EINPROGRESS) {
          const int saved = errno;
          ::close(fd);
          errno = saved;
          io_error("connecting to " + at);
        }
        finish_connect(fd, until, "connecting to " + at, cancelled);
      }
      return fd;
    } catch (const Error& e) {
      // Cancelled, or out of addresses: the error as it is (with the others' where there were).
      if (e.code() == ErrorCode::kAborted || left == 1) {
        if (failures.empty()) throw;
        throw Error(e.code(), std::string(e.what()) + " (and before: " + failures + ")");
      }
      failures += (failures.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw Error(ErrorCode::kIoError, "connecting to " + where + ": no address");
}

}  // namespace tutti::detail
