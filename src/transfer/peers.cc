// The consumer's owners, the connections to them and one get's line to its owner (peers.h).
#include "transfer/peers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transfer/handshake.h"
#include "transfer/wire.h"
#include "util/host_identity.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// After a broken connection to an owner on this host: whether its process has exited. A dying
// process's sockets close just before its exit shows, so this waits up to 100 ms for it.
bool owner_exited_after_break(const AgentIdentity& owner) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(owner.pid), 0));
  if (fd < 0) return !owner_alive(owner);  // no such process
  pollfd p{fd, POLLIN, 0};
  const bool exited = ::poll(&p, 1, 100) > 0 || !owner_alive(owner);
  ::close(fd);
  return exited;
}

bool split_endpoint(const std::string& endpoint, std::string& host, uint16_t& port) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size()) return false;
  host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const long p = std::strtol(endpoint.c_str() + colon + 1, nullptr, 10);
  if (p <= 0 || p > 65535) return false;
  port = static_cast<uint16_t>(p);
  return true;
}

}  // namespace

bool owner_alive(const AgentIdentity& owner) {
  const long pid = static_cast<long>(owner.pid);
  const uint64_t start = process_start_time(pid);
  if (start != 0) return start == owner.start_time;
  // Not read. Gone, unless this process could not look (out of descriptors): then a process of
  // that pid is taken for the owner, rather than a live owner for dead.
  const int fd =
      ::open(("/proc/" + std::to_string(pid)).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return false;
  }
  if (errno != EMFILE && errno != ENFILE) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

void rethrow_with(const std::string& context, const Error& e) {
  throw Error(e.code(), context + ": " + e.what());
}

void rethrow_io(const std::string& context, const AgentIdentity& owner, const AgentIdentity& me,
                const Error& e) {
  const std::string what = e.what();
  if (e.code() == ErrorCode::kIoError && what.find(" is gone") == std::string::npos &&
      owner.same_host(me) && owner_exited_after_break(owner)) {
    throw Error(ErrorCode::kIoError, context + ": " + owner_text(owner) +
                                         " is gone (its process exited or died): " + what);
  }
  if (what.rfind(context, 0) == 0) throw e;
  rethrow_with(context, e);
}

PeerLink::~PeerLink() {
  // Gone by an exception (the get failed after its reply): the owner may still be serving it on
  // that connection, which is closed rather than pooled.
  if (!kept_ || std::uncaught_exceptions() > unwinding_) return;
  try {
    core_.checkin(*peer_, std::move(kept_));
  } catch (...) {  // out of memory: closed instead
  }
}

Message PeerLink::round_trip(MsgType type, const std::function<std::string()>& make,
                             const std::vector<int>& fds, bool* replied) {
  auto conn = kept_ ? std::move(kept_) : core_.checkout(*peer_, deadline_, cancelled_);
  conn->send(type, make(), fds, deadline_, cancelled_);
  Message m = conn->receive(deadline_, cancelled_, kReplySpin);
  if (replied != nullptr) *replied = true;
  if (keep_) {
    kept_ = std::move(conn);
  } else {
    core_.checkin(*peer_, std::move(conn));
  }
  if (m.type == MsgType::kError) {
    for (int f : m.fds) ::close(f);
    throw_error_payload(m.payload);
  }
  return m;
}

Message PeerLink::request(MsgType type, const std::string& payload, const std::vector<int>& fds) {
  return round_trip(
      type, [&] { return payload; }, fds);
}

std::string PeerLink::call(const std::string& request_bytes, std::vector<int>* fds) {
  return call_with([&] { return request_bytes; }, fds, nullptr);
}

std::string PeerLink::call_with(const std::function<std::string()>& make, std::vector<int>* fds,
                                bool* replied) {
  Message m = round_trip(
      MsgType::kCall,
      [&] {
        WireWriter w;
        w.str8(transport_name_);
        w.str32(make());
        return std::move(w.out());
      },
      {}, replied);
  if (fds != nullptr) {
    *fds = std::move(m.fds);
  } else {
    for (int f : m.fds) ::close(f);
  }
  return std::move(m.payload);
}

void PeerLink::stream(const std::vector<TensorView>& into) {
  uint64_t want = 0;
  for (const TensorView& t : into) want += t.nbytes();
  auto conn = core_.checkout(*peer_, deadline_, cancelled_);
  WireWriter w;
  w.u64(object_.id);
  w.u32(object_.generation);
  w.u64(wire_timeout(deadline_));
  w.u8(stream_counts_ ? 1 : 0);
  conn->send(MsgType::kStream, w.out(), {}, deadline_, cancelled_);
  Message m = conn->receive(deadline_, cancelled_);
  if (m.type == MsgType::kError) {
    core_.checkin(*peer_, std::move(conn));
    throw_error_payload(m.payload);
  }
  WireReader r(m.payload, "a stream header from " + owner_text(peer_->owner));
  const uint64_t total = r.u64("total");
  if (total != want) {
    // The stream is out of step: this connection cannot be reused.
    throw Error(ErrorCode::kInternal, "the owner streams " + std::to_string(total) +
                                          " bytes, the ref describes " + std::to_string(want));
  }
  for (const TensorView& t : into) {
    if (t.nbytes() > 0) conn->receive_raw(t.data(), t.nbytes(), deadline_, cancelled_);
  }
  core_.checkin(*peer_, std::move(conn));
}

Peer::~Peer() {
  if (pidfd >= 0) ::close(pidfd);
}

bool Peer::owner_exited() const {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

std::shared_ptr<Peer> AgentCore::peer_for(const AgentIdentity& owner, bool local) {
  std::lock_guard<std::mutex> lock(peers_mutex);
  if (stopping) throw Error(ErrorCode::kAborted, who() + " is shutting down");
  auto& p = peers[{owner.uuid, local}];
  if (!p) {
    p = std::make_shared<Peer>();
    p->owner = owner;
    p->local = local;
    if (local) {
      p->lane = std::make_unique<Lane>();
      // A pidfd tells the owner's exit without a message; taken only while the pid is still the
      // owner's (its start time matches), so a reused pid never passes for the owner.
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(owner.pid), 0));
      if (fd >= 0 && owner_alive(owner)) {
        p->pidfd = fd;
      } else if (fd >= 0) {
        ::close(fd);
      }
    }
  }
  return p;
}

std::unique_ptr<Connection> AgentCore::checkout(Peer& peer, Clock::time_point deadline,
                                                const std::atomic<bool>* cancelled) {
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!peer.idle.empty()) {
      auto c = std::move(peer.idle.back());
      peer.idle.pop_back();
      return c;
    }
  }
  const AgentIdentity& owner = peer.owner;
  int fd;
  try {
    if (peer.local) {
      fd = connect_unix("tutti-agent/" + owner.uuid_text(), deadline, cancelled);
    } else {
      std::string host;
      uint16_t port = 0;
      if (!split_endpoint(owner.tcp_endpoint, host, port)) {
        throw Error(
            ErrorCode::kUnavailable,
            owner_text(owner) + " does not listen on TCP (TransferAgentOptions::listen_tcp)");
      }
      fd = connect_tcp(host, port, deadline, cancelled);
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kIoError) throw;
    // Nobody answers at the owner's address: forgotten, unless the failure was this side's
    // (out of descriptors or memory) and the owner lives on this host. Such an owner keeps the
    // lane its leases are in, and a Peer made again would bring a second lane it never reads: the
    // later leases would not hold the owner's objects. (An owner whose agent went while its
    // process lives refuses the connection: forgotten, its leases are nobody's now.)
    const std::string what = e.what();
    auto says = [&](int err) { return what.find(std::strerror(err)) != std::string::npos; };
    // This side's failures: out of descriptors or memory, or the owner's name not resolved here.
    const bool this_side = says(EMFILE) || says(ENFILE) || says(ENOBUFS) || says(ENOMEM) ||
                           what.rfind("cannot resolve", 0) == 0;
    const bool dead = peer.local && !owner_alive(owner);
    if (!peer.local || dead || !this_side) {
      std::lock_guard<std::mutex> lock(peers_mutex);
      // Only this Peer: another thread may have made a new one for the owner meanwhile.
      auto it = peers.find({owner.uuid, peer.local});
      if (it != peers.end() && it->second.get() == &peer) peers.erase(it);
    }
    throw Error(ErrorCode::kIoError,
                owner_text(owner) +
                    (dead        ? " is gone (its process exited or died)"
                     : this_side ? " cannot be reached from this process"
                                 : " does not answer (its agent was destroyed?)") +
                    ": " + e.what());
  }
  auto conn = std::make_unique<Connection>(fd, owner_text(owner));
  if (!peer.local && tls_client) {
    conn->start_tls(tls_client.get(), /*server=*/false, deadline, cancelled);
  }
  std::vector<int> fds = offer_hello(
      *conn,
      HelloOffer{identity, owner, options.secret, peer.local, peer.local ? peer.lane->fd() : -1},
      deadline, cancelled);
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (peer.local && !peer.slots && !fds.empty()) {
    peer.slots = std::make_unique<SlotView>(fds[0]);
    fds.erase(fds.begin());
  }
  for (int f : fds) ::close(f);
  return conn;
}

void AgentCore::checkin(Peer& peer, std::unique_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (peer.idle.size() < 8) peer.idle.push_back(std::move(connection));
}

namespace {

// Closes the pooled connections of `peer` whose other end hung up (no blocking); true when it
// had some and every one had: its owner's agent is gone.
bool close_hung_up(Peer& peer) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  const size_t had = peer.idle.size();
  if (had == 0) return false;
  std::vector<std::unique_ptr<Connection>> live;
  for (auto& c : peer.idle) {
    if (!hung_up(c->fd())) live.push_back(std::move(c));
  }
  if (live.size() < had) {
    TUTTI_LOG_DEBUG("direct transport: {} hung up {} of its {} pooled connection(s)",
                    owner_text(peer.owner), had - live.size(), had);
  }
  peer.idle = std::move(live);
  return peer.idle.empty();
}

}  // namespace

void AgentCore::reap_peers() {
  // Pooled connections looked at every 100 ms at most (housekeeping may run more often): so
  // that a get does not take one that went bad while nobody used it, nor a get's path pay a poll.
  const auto now = Clock::now();
  const bool look = now >= next_idle_look;
  if (look) next_idle_look = now + std::chrono::milliseconds(100);
  std::lock_guard<std::mutex> lock(peers_mutex);
  for (auto it = peers.begin(); it != peers.end();) {
    // A get or borrow that still uses it holds its own reference to the Peer.
    const bool gone = it->second->owner_exited() || (look && close_hung_up(*it->second));
    it = gone ? peers.erase(it) : std::next(it);
  }
}

void AgentCore::abort_gets() {
  std::lock_guard<std::mutex> lock(active_mutex);
  for (std::atomic<bool>* flag : active) flag->store(true);
}

}  // namespace tutti::detail
