#include "gloo_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "util/logging.h"

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
  if ((k + 1) * kAddressBytes <= list.size()) std::memcpy(&ss, list.data() + k * kAddressBytes, sizeof(ss));
  return ss;
}

}  // namespace

void GlooConnections::record(int r, const std::vector<char>& addresses) {
  std::lock_guard<std::mutex> lock(mutex_);
  published_[r] = addresses;
}

void GlooConnections::find(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  // This rank's pair for rank i listens on its own record i (i < rank) or i - 1; rank i's pair
  // for this rank listens on i's record rank - 1 (i < rank) or rank.
  std::map<std::string, int> mine, peers;
  for (int i = 0; i < world_size; ++i) {
    if (i == rank) continue;
    auto own = published_.find(rank);
    auto theirs = published_.find(i);
    if (own != published_.end()) {
      mine[text_of(address_at(own->second, static_cast<size_t>(i < rank ? i : i - 1)))] = i;
    }
    if (theirs != published_.end()) {
      const sockaddr_storage ss =
          address_at(theirs->second, static_cast<size_t>(i < rank ? rank - 1 : rank));
      peers[text_of(ss)] = i;
      gloo_names_[gloo_name_of(ss)] = i;
    }
  }
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd == ::dirfd(dir)) continue;
    struct stat st;
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, remote{};
    socklen_t local_len = sizeof(local), remote_len = sizeof(remote);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&remote), &remote_len) != 0) {
      continue;  // not connected
    }
    auto accepted = mine.find(text_of(local));
    auto connected = peers.find(text_of(remote));
    if (accepted == mine.end() && connected == peers.end()) continue;
    const int peer = accepted != mine.end() ? accepted->second : connected->second;
    // Gloo names an accepted connection's peer by the address it connected from.
    gloo_names_[gloo_name_of(remote)] = peer;
    sockets_.push_back(
        Socket{static_cast<int>(fd), static_cast<unsigned long>(st.st_ino), peer});
  }
  ::closedir(dir);
  TUTTI_LOG_DEBUG("gloo: rank {}/{} found {} connection(s)", rank, world_size, sockets_.size());
}

bool GlooConnections::still_ours(const Socket& s) const {
  struct stat st;
  return ::fstat(s.fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == s.inode;
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
    if (message.find(name) != std::string::npos) return r;
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
