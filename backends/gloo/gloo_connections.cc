#include "gloo_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "util/logging.h"
#include "util/tcp_link.h"

namespace tutti::gloo_backend {
namespace {

// Gloo's tcp::Address, as its bytes() writes it: a sockaddr_storage and a sequence number.
constexpr size_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(int64_t);

// "ip:port" of an IPv4 or IPv6 address ("" for other families); IPv6 in brackets.
std::string text_of(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return std::string(ip) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return "[" + std::string(ip) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "";
}

// How Gloo's own messages print an address: "[ip]:port", the port as stored (network order).
std::string gloo_name_of(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    port = a->sin_port;
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    port = a->sin6_port;
  }
  return "[" + std::string(ip) + "]:" + std::to_string(port);
}

// Record k of a rank's published list.
sockaddr_storage address_at(const std::vector<char>& list, size_t k) {
  sockaddr_storage ss{};
  if ((k + 1) * kAddressBytes <= list.size())
    std::memcpy(&ss, list.data() + k * kAddressBytes, sizeof(ss));
  return ss;
}

// Whether the pair listening on `self` connects to the one listening on `peer` (rather than
// accepting it): Gloo's tcp::Pair::connect compares the addresses, then the ports as stored
// (network order), and the greater side connects.
bool connects_first(const sockaddr_storage& self, const sockaddr_storage& peer) {
  int cmp = 0;
  if (self.ss_family == AF_INET && peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&self);
    const auto* b = reinterpret_cast<const sockaddr_in*>(&peer);
    cmp = std::memcmp(&a->sin_addr, &b->sin_addr, sizeof(in_addr));
    if (cmp == 0) cmp = static_cast<int>(a->sin_port) - static_cast<int>(b->sin_port);
  } else if (self.ss_family == AF_INET6 && peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&self);
    const auto* b = reinterpret_cast<const sockaddr_in6*>(&peer);
    cmp = std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(in6_addr));
    if (cmp == 0) cmp = static_cast<int>(a->sin6_port) - static_cast<int>(b->sin6_port);
  }
  return cmp > 0;
}

// The scan below looks at every descriptor of the process, including ones other threads (Gloo's,
// the store client's, other groups') may close or reuse at that moment: it never trusts a number
// (a socket is kept with its inode and checked again before use). It asks the kernel directly
// rather than through libc's wrappers, which ThreadSanitizer intercepts to pair a descriptor's
// uses with its close: a look at a descriptor this code does not own is not such a use.
int stat_of(int fd, struct stat* st) {
#ifdef SYS_fstat
  return static_cast<int>(::syscall(SYS_fstat, fd, st));
#else  // aarch64 has only the *at form
  return static_cast<int>(::syscall(SYS_newfstatat, fd, "", st, AT_EMPTY_PATH));
#endif
}
int name_of(long call, int fd, sockaddr_storage* ss) {
  socklen_t len = sizeof(*ss);
  return static_cast<int>(::syscall(call, fd, reinterpret_cast<sockaddr*>(ss), &len));
}

}  // namespace

void GlooConnections::record(int r, const std::vector<char>& addresses) {
  std::lock_guard<std::mutex> lock(mutex_);
  published_[r] = addresses;
}

void GlooConnections::find(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  // This rank's pair for rank i listens on its own record i (i < rank) or i - 1; rank i's pair
  // for this rank listens on i's record rank - 1 (i < rank) or rank. Of the two, the side whose
  // address compares greater connects and closes its listener (Gloo's rule), so its address is
  // free for any later socket of this process (another group's, or another rank's where ranks
  // are threads). A pair's socket is therefore known only by the address that stays taken: its
  // local address where this rank accepted, its peer's where this rank connected.
  std::map<std::string, int> accepted_on, connected_to;
  auto own = published_.find(rank);
  for (int i = 0; i < world_size; ++i) {
    if (i == rank) continue;
    auto theirs = published_.find(i);
    if (own == published_.end() || theirs == published_.end()) continue;
    const sockaddr_storage mine =
        address_at(own->second, static_cast<size_t>(i < rank ? i : i - 1));
    const sockaddr_storage peer =
        address_at(theirs->second, static_cast<size_t>(i < rank ? rank - 1 : rank));
    gloo_names_[gloo_name_of(peer)] = i;
    if (connects_first(mine, peer)) {
      connected_to[text_of(peer)] = i;
    } else {
      accepted_on[text_of(mine)] = i;
    }
  }
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st;
    if (stat_of(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, remote{};
    if (name_of(SYS_getsockname, static_cast<int>(fd), &local) != 0 ||
        name_of(SYS_getpeername, static_cast<int>(fd), &remote) != 0) {
      continue;  // not connected
    }
    auto accepted = accepted_on.find(text_of(local));
    auto connected = connected_to.find(text_of(remote));
    if (accepted == accepted_on.end() && connected == connected_to.end()) continue;
    const int peer = accepted != accepted_on.end() ? accepted->second : connected->second;
    // Gloo names an accepted connection's peer by the address it connected from.
    gloo_names_[gloo_name_of(remote)] = peer;
    detail::watch_link(static_cast<int>(fd));  // a peer's host cut off is seen within the bound
    sockets_.push_back(Socket{static_cast<int>(fd), static_cast<unsigned long>(st.st_ino), peer});
  }
  ::closedir(dir);
  TUTTI_LOG_DEBUG("gloo: rank {}/{} found {} connection(s)", rank, world_size, sockets_.size());
}

bool GlooConnections::still_ours(const Socket& s) const {
  struct stat st;
  return stat_of(s.fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == s.inode;
}

void GlooConnections::reset_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reset_) return;
  reset_ = true;
  for (const Socket& s : sockets_) {
    if (!still_ours(s)) continue;  // Gloo closed it (after an error): nothing to end
    // The peer gets a RST at once (a connect to AF_UNSPEC disconnects a TCP socket), even behind
    // data it has not read. The shutdown then marks the socket closed both ways, which wakes
    // Gloo's own loop here (the disconnect alone leaves it looking like a fresh socket).
    sockaddr reset{};
    reset.sa_family = AF_UNSPEC;
    ::connect(s.fd, &reset, sizeof(reset));
    ::shutdown(s.fd, SHUT_RDWR);
  }
}

int GlooConnections::rank_in(const std::string& message) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, r] : gloo_names_) {
    // "[ip]:1654" is not "[ip]:16540": the port must end where the message's does.
    for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
      const size_t end = at + name.size();
      if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end])))
        return r;
    }
  }
  return -1;
}

int GlooConnections::socket_for(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Socket& s : sockets_) {
    if (s.peer == peer) return s.fd;
  }
  return -1;
}

size_t GlooConnections::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sockets_.size();
}

}  // namespace tutti::gloo_backend
