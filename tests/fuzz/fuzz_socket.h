// The fuzz targets' own client side of a socket, safe against the signals libFuzzer sends itself.
//
// libFuzzer's -timeout=N arms SIGALRM every N/2+1 seconds without SA_RESTART, so a blocking
// connect(), poll(), recv() or send() in a target may return EINTR mid-run (the test command's
// fuzz_store_protocol aborted on one at its 6th second). Each call here retries it; connect()
// interrupted goes on in the kernel, so it waits for the socket to become writable and reads the
// outcome from SO_ERROR.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace tutti_fuzz {

// poll() for one fd; 1 when ready, 0 on timeout (an interrupted wait starts its timeout again).
inline int poll_one(int fd, short events, int timeout_ms) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, timeout_ms);
    if (n >= 0) return n;
    if (errno != EINTR) return 0;
  }
}

// Connects or aborts: the servers under test are this process's own and always listening.
inline void connect_or_die(int fd, const sockaddr* addr, socklen_t len) {
  if (::connect(fd, addr, len) == 0) return;
  if (errno != EINTR) std::abort();
  if (poll_one(fd, POLLOUT, 10000) != 1) std::abort();
  int err = 0;
  socklen_t n = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0 || err != 0) std::abort();
}

// recv() that retries an interrupted call; <= 0 when the peer closed or failed.
inline ssize_t recv_some(int fd, char* buf, size_t len) {
  while (true) {
    const ssize_t n = ::recv(fd, buf, len, 0);
    if (n >= 0 || errno != EINTR) return n;
  }
}

// Sends everything, or stops quietly when the server has closed the connection.
inline void send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace tutti_fuzz
