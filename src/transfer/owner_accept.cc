// The owner's listeners and housekeeping: connections accepted (each given a serving thread of
// its own, owner_server.cc), the consumers it knows dropped once their processes are gone, and
// objects settled (agent_core.h).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <thread>

#include "transfer/agent_core.h"
#include "transfer/wire.h"
#include "util/logging.h"
#include "util/tcp_link.h"

namespace tutti::detail {

void AgentCore::housekeeping_loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping) {
    auto wake = Clock::now() + std::chrono::milliseconds(200);
    for (const auto& [id, o] : objects) {
      if (o.handles == 0 && o.state != kSlotRetiring && o.keep_until > Clock::now()) {
        wake = std::min(wake, o.keep_until);
      }
    }
    changed.wait_until(lock, wake);
    reap_consumers_locked();
    settle_all_locked();
    lock.unlock();
    reap_peers();
    lock.lock();
  }
}

void AgentCore::drop_consumer_locked(const std::string& uuid) {
  auto c = consumers.find(uuid);
  if (c == consumers.end()) return;
  for (const auto& [id, count] : c->second->leases) {
    auto it = objects.find(id);
    if (it != objects.end()) it->second.local_leases -= count;
  }
  if (c->second->pidfd >= 0) ::close(c->second->pidfd);
  consumers.erase(c);
  settle_all_locked();
}

void AgentCore::reap_consumers_locked() {
  std::vector<std::string> gone;
  for (const auto& [uuid, c] : consumers) {
    if (c->connections > 0 || c->pidfd < 0) continue;
    pollfd p{c->pidfd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) gone.push_back(uuid);
  }
  for (const std::string& uuid : gone) drop_consumer_locked(uuid);
}

void AgentCore::accept_loop(int listener, bool local) {
  while (!stopping) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (stopping || errno == EINVAL || errno == EBADF) return;
      // Out of descriptors or kernel memory: the next accept would fail the same way at once.
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    // Out of memory while taking one connection drops that connection, not the acceptor: an
    // exception out of this thread would end the process.
    try {
      if (!take_connection(fd, local)) return;
    } catch (const std::exception& e) {
      try {
        TUTTI_LOG_ERROR("direct transport: {}: dropped a connection: {}", who(), e.what());
      } catch (...) {
      }
    }
  }
}

bool AgentCore::take_connection(int fd, bool local) {
  if (!local) {
    // The answer goes out as a header and a payload: with Nagle's algorithm the payload waited
    // for the consumer's delayed ACK of the header (40 ms for every small get across hosts).
    const int on = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    watch_link(fd);  // a consumer's host cut off fails its connection within the bound
  }
  std::unique_ptr<Connection> conn;
  try {
    conn =
        std::make_unique<Connection>(fd, local ? "a consumer on this host" : "a remote consumer");
  } catch (...) {
    ::close(fd);  // not yet the connection's to close
    throw;
  }
  if (local && conn->peer_uid() != static_cast<long>(::getuid())) {
    TUTTI_LOG_WARN("direct transport: {} refused a connection from uid {}", who(),
                   conn->peer_uid());
    try {
      const Error e(
          ErrorCode::kUnavailable,
          who() + " runs as uid " + std::to_string(::getuid()) +
              " and serves no other user on its host (uid " + std::to_string(conn->peer_uid()) +
              "): the owner's TCP listener (TransferAgentOptions::listen_tcp) is the way");
      conn->send(MsgType::kError, error_payload(e), {},
                 Clock::now() + std::chrono::milliseconds(100));
    } catch (const Error&) {
    }
    return true;
  }
  join_ended_serving();
  std::lock_guard<std::mutex> lock(mutex);
  if (stopping) return false;
  serving_fds.insert(fd);
  // Inserted under the lock the thread's end takes: it finds itself there. Its map node is made
  // before the thread starts, so that storing the handle cannot fail once it runs (a thread left
  // detached would not be waited for by stop()). No thread to be had (the process's limit) drops
  // this connection, not the acceptor (an exception out of it ended the process): the consumer
  // sees it closed.
  try {
    std::map<std::thread::id, std::thread> made;
    auto node = made.extract(made.emplace(std::thread::id(), std::thread()).first);
    node.mapped() = std::thread([self = shared_from_this(), c = std::move(conn), local]() mutable {
      self->serve(std::move(c), local);
    });
    node.key() = node.mapped().get_id();
    // A node handle's insert allocates nothing; the key is new (a live thread's id).
    auto put = serving_threads.insert(std::move(node));
    if (!put.inserted) put.node.mapped().detach();
  } catch (const std::exception& e) {
    serving_fds.erase(fd);  // closed with the connection the thread did not take
    TUTTI_LOG_ERROR("direct transport: {}: serving a connection: {}", who(), e.what());
  }
  return true;
}

}  // namespace tutti::detail
