#include "transfer/channel.h"

#include <openssl/err.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "tutti/error.h"
#include "util/tcp_link.h"
#include "util/tls.h"

namespace tutti::detail {
namespace {

constexpr size_t kMaxMessage = 64u << 20;  // control messages; object bytes go raw
constexpr int kMaxFds = 64;
constexpr std::chrono::milliseconds kSlice{20};  // how often a wait looks at `cancelled`

}  // namespace

[[noreturn]] void io_error(const std::string& what) {
  throw Error(ErrorCode::kIoError, what + ": " + std::strerror(errno));
}

[[noreturn]] void Connection::failed(const std::string& doing) const {
  const std::string why = socket_error_text(errno);
  throw Error(ErrorCode::kIoError, doing + ": " + why);
}

Connection::~Connection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
}

void Connection::start_tls(SSL_CTX* ctx, bool server, Clock::time_point deadline,
                           const std::atomic<bool>* cancelled) {
  ssl_ = SSL_new(ctx);
  BIO* bio = ssl_ != nullptr ? socket_bio(fd_) : nullptr;
  if (bio == nullptr) {
    throw Error(ErrorCode::kInternal, "TLS with " + peer_ + ": " + tls_error_text());
  }
  SSL_set_bio(ssl_, bio, bio);
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int rc = server ? SSL_accept(ssl_) : SSL_connect(ssl_);
    if (rc == 1) {
      if (!used_the_key(ssl_)) {
        throw Error(ErrorCode::kInvalidArgument,
                    "the TLS handshake with " + peer_ + " was not made with the shared key");
      }
      return;
    }
    const int e = SSL_get_error(ssl_, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      try {
        wait_for(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, cancelled,
                 "TLS handshake with");
      } catch (const Error& t) {
        if (t.code() != ErrorCode::kTimeout) throw;
        throw Error(ErrorCode::kTimeout, std::string(t.what()) +
                                             " (does it use TLS? TUTTI_TRANSFER_TLS=1 on both "
                                             "agents)");
      }
      continue;
    }
    if (e == SSL_ERROR_SSL) {
      // An answer that is no TLS record: the other side speaks in the clear.
      const bool plain = ERR_GET_REASON(ERR_peek_error()) == SSL_R_WRONG_VERSION_NUMBER;
      throw Error(ErrorCode::kInvalidArgument,
                  "the TLS handshake with " + peer_ + " failed (" + tls_error_text() + "): " +
                      (plain ? std::string("it answered in the clear: it does not use TLS, and "
                                           "this agent does (TUTTI_TRANSFER_TLS must be the same "
                                           "on both)")
                             : std::string("both agents need TLS (TUTTI_TRANSFER_TLS=1) and the "
                                           "same secret")));
    }
    throw Error(ErrorCode::kIoError,
                "the TLS handshake with " + peer_ + " broke: " +
                    (errno != 0 ? std::string(std::strerror(errno))
                                : std::string("it closed the connection (does it use TLS? "
                                              "TUTTI_TRANSFER_TLS=1 on both agents)")));
  }
}

std::string Connection::peek(size_t bytes, Clock::time_point deadline) {
  std::string out(bytes, '\0');
  while (true) {
    const ssize_t n = ::recv(fd_, out.data(), bytes, MSG_PEEK);
    if (n == static_cast<ssize_t>(bytes)) return out;
    if (n > 0) {
      // Fewer have come. The socket reads as ready already: look again in a millisecond, unless
      // no more can come (the peer closed, or this side shut the socket down).
      if (Clock::now() >= deadline) return out.substr(0, static_cast<size_t>(n));
      pollfd p{fd_, POLLRDHUP, 0};
      if (::poll(&p, 1, 1) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        return out.substr(0, static_cast<size_t>(n));
      }
      continue;
    }
    await_readable(n, deadline, nullptr);
  }
}

bool looks_like_tls(const std::string& first) {
  // A TLS record: handshake (0x16), version 3.x (x from 1, TLS 1.0's, to 4).
  return first.size() >= 3 && first[0] == 0x16 && first[1] == 0x03 && first[2] >= 0x01 &&
         first[2] <= 0x04;
}

size_t Connection::tls_io(bool write, void* data, size_t bytes, Clock::time_point deadline,
                          const std::atomic<bool>* cancelled) {
  const int n = static_cast<int>(std::min<size_t>(bytes, 1 << 30));
  while (true) {
    if (cancelled != nullptr && cancelled->load()) {
      throw Error(ErrorCode::kAborted,
                  std::string(write ? "sending to " : "receiving from ") + peer_ + ": cancelled");
    }
    ERR_clear_error();
    errno = 0;
    const int rc = write ? SSL_write(ssl_, data, n) : SSL_read(ssl_, data, n);
    if (rc > 0) return static_cast<size_t>(rc);
    const int e = SSL_get_error(ssl_, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      wait_for(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, cancelled,
               write ? "sending to" : "waiting for");
      continue;
    }
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0)) {
      throw Error(ErrorCode::kIoError, peer_ + " closed the connection (it exited or died)");
    }
    throw Error(ErrorCode::kIoError,
                std::string(write ? "sending to " : "receiving from ") + peer_ + ": " +
                    (e == SSL_ERROR_SYSCALL ? socket_error_text(errno) : tls_error_text()));
  }
}

void Connection::wait_for(short events, Clock::time_point deadline,
                          const std::atomic<bool>* cancelled, const char* doing) {
  LinkWatch link;
  while (true) {
    if (cancelled != nullptr && cancelled->load()) {
      throw Error(ErrorCode::kAborted, std::string(doing) + " " + peer_ + ": cancelled");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw Error(ErrorCode::kTimeout, std::string(doing) + " " + peer_ + ": timed out");
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                std::chrono::milliseconds(1);
    if (cancelled != nullptr) left = std::min(left, kSlice);
    // A quarter of a link's bound at most, 200 ms once it looked cut (util/tcp_link.h).
    const auto bound = link_timeout();
    if (bound.count() > 0) {
      left = std::min(left, link.suspect() ? LinkWatch::kSecondLook : bound / 4);
    }
    left = std::min(left, std::chrono::milliseconds(1000));
    pollfd p{fd_, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) io_error(std::string(doing) + " " + peer_);
    if (rc > 0) return;  // ready, or an error/hang-up the next call reports
    long silent_ms = 0;
    if (rc == 0 && link.cut(fd_, silent_ms)) {  // TCP: nothing heard for the link's bound
      throw Error(ErrorCode::kIoError,
                  std::string(doing) + " " + peer_ + ": " + link_cut_text(silent_ms));
    }
  }
}

void Connection::send(MsgType type, std::string_view payload, const std::vector<int>& fds,
                      Clock::time_point deadline, const std::atomic<bool>* cancelled) {
  char header[5];
  const uint32_t length = static_cast<uint32_t>(payload.size() + 1);
  std::memcpy(header, &length, 4);
  header[4] = static_cast<char>(type);
  if (ssl_ != nullptr && !fds.empty()) {
    throw Error(ErrorCode::kInternal, "sending to " + peer_ + ": descriptors over TLS");
  }
  if (fds.empty()) {
    send_raw({{header, 5}, {const_cast<char*>(payload.data()), payload.size()}}, deadline,
             cancelled);
    return;
  }
  // The descriptors ride on the header's first byte.
  char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  iovec first{header, 1};
  msghdr msg{};
  msg.msg_iov = &first;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  while (true) {
    wait_for(POLLOUT, deadline, cancelled, "sending to");
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n == 1) break;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    failed("sending to " + peer_);
  }
  send_raw({{header + 1, 4}, {const_cast<char*>(payload.data()), payload.size()}}, deadline,
           cancelled);
}

void Connection::send_raw(std::vector<iovec> parts, Clock::time_point deadline,
                          const std::atomic<bool>* cancelled) {
  if (ssl_ != nullptr) {
    for (const iovec& part : parts) {
      auto* p = static_cast<char*>(part.iov_base);
      for (size_t done = 0; done < part.iov_len;) {
        done += tls_io(/*write=*/true, p + done, part.iov_len - done, deadline, cancelled);
      }
    }
    return;
  }
  size_t at = 0;  // the first part not fully sent
  while (at < parts.size()) {
    if (parts[at].iov_len == 0) {
      ++at;
      continue;
    }
    const int count = static_cast<int>(std::min<size_t>(parts.size() - at, IOV_MAX));
    msghdr msg{};
    msg.msg_iov = parts.data() + at;
    msg.msg_iovlen = count;
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) {
        wait_for(POLLOUT, deadline, cancelled, "sending to");
        continue;
      }
      failed("sending to " + peer_);
    }
    size_t sent = static_cast<size_t>(n);
    while (sent > 0 && at < parts.size()) {
      const size_t take = std::min(sent, parts[at].iov_len);
      parts[at].iov_base = static_cast<char*>(parts[at].iov_base) + take;
      parts[at].iov_len -= take;
      sent -= take;
      if (parts[at].iov_len == 0) ++at;
    }
  }
}

void Connection::receive_raw(void* data, size_t bytes, Clock::time_point deadline,
                             const std::atomic<bool>* cancelled) {
  auto* out = static_cast<char*>(data);
  size_t got = 0;
  while (got < bytes) {
    // Bytes may keep coming faster than they are read: look at cancel on every read too.
    if (cancelled != nullptr && cancelled->load()) {
      throw Error(ErrorCode::kAborted, "receiving from " + peer_ + ": cancelled");
    }
    if (ssl_ != nullptr) {
      got += tls_io(/*write=*/false, out + got, bytes - got, deadline, cancelled);
      continue;
    }
    const ssize_t n = ::recv(fd_, out + got, bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    await_readable(n, deadline, cancelled);
  }
}

void Connection::await_readable(ssize_t n, Clock::time_point deadline,
                                const std::atomic<bool>* cancelled) {
  if (n == 0)
    throw Error(ErrorCode::kIoError, peer_ + " closed the connection (it exited or died)");
  if (errno != EAGAIN && errno != EINTR) failed("receiving from " + peer_);
  wait_for(POLLIN, deadline, cancelled, "waiting for");
}

size_t Connection::receive_first(char* into, size_t bytes, std::vector<int>& fds,
                                 Clock::time_point deadline, const std::atomic<bool>* cancelled,
                                 std::chrono::microseconds spin) {
  char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  // Spinning, the read itself looks for the message (a poll first would cost a call more).
  const auto spin_until = spin.count() > 0 ? std::min(deadline, Clock::now() + spin) : deadline;
  bool spinning = spin.count() > 0;
  while (true) {
    iovec iov{into, bytes};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            fds.push_back(fd);
          }
        }
      }
      return static_cast<size_t>(n);
    }
    if (spinning && n < 0 && (errno == EAGAIN || errno == EINTR)) {
      sched_yield();  // a thread that would answer on this core goes first
      spinning = Clock::now() < spin_until;
      continue;
    }
    await_readable(n, deadline, cancelled);
  }
}

Message Connection::receive(Clock::time_point deadline, const std::atomic<bool>* cancelled,
                            std::chrono::microseconds spin) {
  return *receive_next(deadline, deadline, cancelled, spin);
}

std::optional<Message> Connection::receive_next(Clock::time_point idle_until,
                                                Clock::time_point deadline,
                                                const std::atomic<bool>* cancelled,
                                                std::chrono::microseconds spin) {
  Message m;
  // The header (length, type) in one read where it came whole; with any descriptors sent along
  // its first byte. Its first byte by `idle_until`: a timeout before it leaves nothing half read.
  char header[5];
  size_t got = 0;
  try {
    if (ssl_ == nullptr) {
      got = receive_first(header, sizeof(header), m.fds, std::min(idle_until, deadline), cancelled,
                          spin);
    } else {
      receive_raw(header, 1, std::min(idle_until, deadline), cancelled);
      got = 1;
    }
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout && idle_until < deadline) return std::nullopt;
    throw;
  }
  try {
    receive_raw(header + got, sizeof(header) - got, deadline, cancelled);
    uint32_t length;
    std::memcpy(&length, header, 4);
    if (length == 0 || length > kMaxMessage) {
      throw Error(ErrorCode::kIoError, peer_ + " sent a message of " + std::to_string(length) +
                                           " bytes: not a tutti agent, or a broken one");
    }
    m.type = static_cast<MsgType>(header[4]);
    m.payload.resize(length - 1);
    if (length > 1) receive_raw(m.payload.data(), length - 1, deadline, cancelled);
  } catch (...) {
    for (int fd : m.fds) ::close(fd);
    throw;
  }
  return m;
}

long Connection::peer_pid() const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
  return cred.pid;
}

long Connection::peer_uid() const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
  return cred.uid;
}

}  // namespace tutti::detail
