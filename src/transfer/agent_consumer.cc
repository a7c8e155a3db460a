// The consumer's side of a TransferAgent: the connections to owners, leases, and get/borrow.
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "transfer/agent_core.h"
#include "transfer/group_transport.h"
#include "transfer/wire.h"
#include "util/deadline.h"
#include "util/host_identity.h"
#include "util/logging.h"
#include "util/crypto.h"

namespace tutti::detail {
namespace {

// Prefixes an error from below with what this get was, keeping its code.
[[noreturn]] void rethrow_with(const std::string& context, const Error& e) {
  throw Error(e.code(), context + ": " + e.what());
}

std::string owner_text(const AgentIdentity& owner) {
  return "agent '" + owner.name + "' (pid " + std::to_string(owner.pid) + ")";
}

// Whether the owner's process still runs (one host only: the pid and its start time).
bool owner_alive(const AgentIdentity& owner) {
  return process_start_time(static_cast<long>(owner.pid)) == owner.start_time;
}

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

// A kIoError from a broken connection says "reset by peer"; when the owner's process is what
// went, say that (the owner died), keeping the transport's words after it.
[[noreturn]] void rethrow_io(const std::string& context, const AgentIdentity& owner,
                             const AgentIdentity& me, const Error& e) {
  const std::string what = e.what();
  if (e.code() == ErrorCode::kIoError && what.find(" is gone") == std::string::npos &&
      owner.same_host(me) && owner_exited_after_break(owner)) {
    throw Error(ErrorCode::kIoError, context + ": " + owner_text(owner) +
                                         " is gone (its process exited or died): " + what);
  }
  if (what.rfind(context, 0) == 0) throw e;
  rethrow_with(context, e);
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

// What is left until `deadline`, as a request's timeout: at least 1 ms, at most a day (the owner
// caps it too).
uint64_t wire_timeout(Clock::time_point deadline) {
  const auto left = time_left(deadline);
  return static_cast<uint64_t>(std::clamp<int64_t>(left.count(), 1, 86400000));
}

// Registers a get's cancel flag for abort() while it runs.
class ActiveGet {
 public:
  ActiveGet(AgentCore& core, std::atomic<bool>* flag) : core_(core), flag_(flag) {
    std::lock_guard<std::mutex> lock(core_.active_mutex);
    core_.active.push_back(flag_);
  }
  ~ActiveGet() {
    std::lock_guard<std::mutex> lock(core_.active_mutex);
    auto& a = core_.active;
    auto it = std::find(a.begin(), a.end(), flag_);
    if (it != a.end()) {
      *it = a.back();
      a.pop_back();
    }
  }

 private:
  AgentCore& core_;
  std::atomic<bool>* flag_;
};

}  // namespace

// The consumer's line to one owner for one get (TransportPeer for the transports).
class PeerLink final : public TransportPeer {
 public:
  PeerLink(AgentCore& core, std::shared_ptr<Peer> peer, Clock::time_point deadline,
           const std::atomic<bool>* cancelled, ObjectId object)
      : core_(core), peer_(std::move(peer)), deadline_(deadline), cancelled_(cancelled),
        object_(object) {}

  const AgentIdentity& owner() const override { return peer_->owner; }

  // One request, one reply: kError replies are rethrown with the owner's code.
  Message request(MsgType type, const std::string& payload, const std::vector<int>& fds = {}) {
    auto conn = core_.checkout(*peer_, deadline_, cancelled_);
    conn->send(type, payload, fds, deadline_, cancelled_);
    Message m = conn->receive(deadline_, cancelled_);
    core_.checkin(*peer_, std::move(conn));
    if (m.type == MsgType::kError) {
      for (int f : m.fds) ::close(f);
      throw_error_payload(m.payload);
    }
    return m;
  }

  // One request, one reply, kError replies included; the request is made once a connection is
  // up (`sent` says whether it may have reached the owner).
  Message exchange(MsgType type, const std::function<std::string()>& make, bool* sent) {
    auto conn = core_.checkout(*peer_, deadline_, cancelled_);
    const std::string payload = make();
    *sent = true;
    conn->send(type, payload, {}, deadline_, cancelled_);
    Message m = conn->receive(deadline_, cancelled_);
    core_.checkin(*peer_, std::move(conn));
    return m;
  }

  std::string call(const std::string& request_bytes, std::vector<int>* fds) override {
    WireWriter w;
    w.str8(transport_name_);
    w.str32(request_bytes);
    Message m = request(MsgType::kCall, w.out());
    if (fds != nullptr) {
      *fds = std::move(m.fds);
    } else {
      for (int f : m.fds) ::close(f);
    }
    return std::move(m.payload);
  }

  void stream(const std::vector<TensorView>& into) override {
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

  void set_transport(std::string name) { transport_name_ = std::move(name); }
  // Whether the owner counts a completed stream as one of the object's expected gets: the
  // socket path does; a transport streaming inside a lease does not (ending the lease counts).
  void set_stream_counts(bool counts) { stream_counts_ = counts; }

 private:
  AgentCore& core_;
  std::shared_ptr<Peer> peer_;
  Clock::time_point deadline_;
  const std::atomic<bool>* cancelled_;
  ObjectId object_;
  std::string transport_name_;
  bool stream_counts_ = false;
};

// A lease taken for one get: a get that fails, is cancelled or times out gives it back on the way
// out (with a second of its own for the messages, its deadline may be gone).
class LeaseGuard {
 public:
  LeaseGuard(AgentCore& core, const AgentCore::Resolved& r, AgentCore::Lease lease);
  ~LeaseGuard();
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;
  // The get completed: the lease ends, counted as a get.
  void complete(PeerLink& link);
  // The caller keeps the lease from now on.
  AgentCore::Lease release();

 private:
  AgentCore& core_;
  const AgentCore::Resolved& r_;
  AgentCore::Lease lease_;
  bool held_ = true;
};

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
      fd = connect_unix("tutti-agent/" + owner.uuid_text(), deadline);
    } else {
      std::string host;
      uint16_t port = 0;
      if (!split_endpoint(owner.tcp_endpoint, host, port)) {
        throw Error(ErrorCode::kUnavailable,
                    owner_text(owner) + " does not listen on TCP (TransferAgentOptions::listen_tcp)");
      }
      fd = connect_tcp(host, port, deadline);
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kIoError) throw;
    // Nobody answers at the owner's address: it is gone. Forget it.
    {
      std::lock_guard<std::mutex> lock(peers_mutex);
      peers.erase({owner.uuid, peer.local});
    }
    const bool dead = peer.local && !owner_alive(owner);
    throw Error(ErrorCode::kIoError,
                owner_text(owner) + (dead ? " is gone (its process exited or died)"
                                          : " does not answer (its agent was destroyed?)") +
                    ": " + e.what());
  }
  auto conn = std::make_unique<Connection>(fd, owner_text(owner));
  if (!peer.local && tls_client) {
    conn->start_tls(tls_client.get(), /*server=*/false, deadline, cancelled);
  }
  const std::string my_nonce = random_bytes(kHelloNonceBytes);
  WireWriter w;
  w.str32(encode_identity(identity));
  w.str32("");  // protocol 1's proof: an owner of that build reads on to the version
  w.u32(kProtocolVersion);
  w.str8(my_nonce);
  std::vector<int> fds;
  if (peer.local) fds.push_back(peer.lane->fd());
  conn->send(MsgType::kHello, w.out(), fds, deadline, cancelled);
  Message m = conn->receive(deadline, cancelled);
  std::string their_nonce;  // the owner's, when it has a secret
  if (m.type == MsgType::kChallenge) {
    for (int f : m.fds) ::close(f);
    WireReader r(m.payload, "the hello's challenge from " + owner_text(owner));
    their_nonce = r.str8("nonce");
    // Without a secret the proof is empty: the owner refuses it, naming the secret.
    WireWriter p;
    p.str8(options.secret.empty() ? std::string()
                                  : hello_proof(options.secret, "consumer", owner, identity,
                                                their_nonce, my_nonce));
    conn->send(MsgType::kProof, p.out(), {}, deadline, cancelled);
    m = conn->receive(deadline, cancelled);
  }
  if (m.type == MsgType::kError) {
    for (int f : m.fds) ::close(f);
    throw_error_payload(m.payload);
  }
  AgentIdentity them;
  uint32_t version = 0;
  std::string their_proof;
  try {
    WireReader r(m.payload, "the hello's reply from " + owner_text(owner));
    them = decode_identity(r.str32("identity", 4096));
    version = r.u32("protocol version");
    if (version == kProtocolVersion) their_proof = r.str8("proof");
  } catch (...) {
    for (int f : m.fds) ::close(f);
    throw;
  }
  if (version != kProtocolVersion) {
    for (int f : m.fds) ::close(f);
    throw Error(ErrorCode::kInvalidUsage,
                owner_text(owner) + " speaks the direct transport's protocol " +
                    std::to_string(version) + ", this agent " +
                    std::to_string(kProtocolVersion) + " (different tutti versions)");
  }
  if (them.uuid != owner.uuid) {
    for (int f : m.fds) ::close(f);
    throw Error(ErrorCode::kIoError, "a different agent ('" + them.name + "') answers at " +
                                         owner_text(owner) + "'s address");
  }
  // With a secret, the owner must prove it over this connection's nonces: whoever answers at
  // the owner's address without it is not the owner.
  if (!options.secret.empty() &&
      !same_secret(their_proof,
                   hello_proof(options.secret, "owner", owner, identity, their_nonce, my_nonce))) {
    for (int f : m.fds) ::close(f);
    throw Error(ErrorCode::kInvalidArgument,
                "whoever answers at " + owner_text(owner) + "'s address does not prove the shared "
                "secret (the owner has none, or another one)");
  }
  // On one host the kernel says which process answers: the ref's pid must be it (cross-memory
  // reads go to that pid).
  if (peer.local && conn->peer_pid() != static_cast<long>(owner.pid)) {
    for (int f : m.fds) ::close(f);
    throw Error(ErrorCode::kInvalidArgument,
                owner_text(owner) + " answers from pid " + std::to_string(conn->peer_pid()) +
                    ": the ref names another process");
  }
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (peer.local && !peer.slots && !m.fds.empty()) {
    peer.slots = std::make_unique<SlotView>(m.fds[0]);
    m.fds.erase(m.fds.begin());
  }
  for (int f : m.fds) ::close(f);
  return conn;
}

void AgentCore::checkin(Peer& peer, std::unique_ptr<Connection> connection) {
  std::lock_guard<std::mutex> lock(peer.mutex);
  if (peer.idle.size() < 8) peer.idle.push_back(std::move(connection));
}

void AgentCore::reap_peers() {
  std::lock_guard<std::mutex> lock(peers_mutex);
  for (auto it = peers.begin(); it != peers.end();) {
    // A borrow that still reads from it holds its own reference to the Peer.
    it = it->second->owner_exited() ? peers.erase(it) : std::next(it);
  }
}

void AgentCore::abort_gets() {
  std::lock_guard<std::mutex> lock(active_mutex);
  for (std::atomic<bool>* flag : active) flag->store(true);
}

namespace {

void check_targets(const AgentCore& core, const char* op, const TensorRef& ref,
                   const std::vector<TensorView>& targets, bool cuda = false) {
  auto context = [&] { return core.context(op, ref); };
  const auto& metas = ref.tensors();
  if (targets.empty()) return;
  if (targets.size() != metas.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                context() + ": " + std::to_string(targets.size()) + " targets for " +
                    std::to_string(metas.size()) + " tensors");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const TensorView& t = targets[i];
    const TensorMeta& m = metas[i];
    if (t.dtype() != m.dtype || static_cast<uint64_t>(t.numel()) != static_cast<uint64_t>(m.numel())) {
      throw Error(ErrorCode::kInvalidArgument, context() + ": target " + std::to_string(i) + " is " +
                                                   t.str() + ", the tensor is " + m.str());
    }
    if ((t.device().type == DeviceType::kCUDA) != cuda) {
      throw Error(ErrorCode::kInvalidArgument, context() + ": target " + std::to_string(i) +
                                                   " is on " + t.device().str() + "; transport '" +
                                                   ref.transport() + "' receives into " +
                                                   (cuda ? "CUDA" : "CPU") + " memory");
    }
  }
  // Targets may not share bytes: sorted by address, each ends before the next begins.
  std::vector<std::pair<uintptr_t, size_t>> spans;  // (start, index)
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].nbytes() > 0) spans.emplace_back(reinterpret_cast<uintptr_t>(targets[i].data()), i);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const TensorView& prev = targets[spans[k - 1].second];
    if (spans[k - 1].first + prev.nbytes() > spans[k].first) {
      throw Error(ErrorCode::kInvalidArgument,
                  context() + ": targets " + std::to_string(std::min(spans[k - 1].second, spans[k].second)) +
                      " and " + std::to_string(std::max(spans[k - 1].second, spans[k].second)) +
                      " overlap");
    }
  }
}

// Buffers get allocates when it is given no targets.
std::vector<TensorView> allocate_targets(const TensorRef& ref,
                                         std::vector<std::shared_ptr<void>>& storage) {
  std::vector<TensorView> out;
  for (const TensorMeta& m : ref.tensors()) {
    storage.push_back(allocate_bytes(m.nbytes()));
    out.emplace_back(storage.back().get(), m.dtype, m.shape, Device::cpu());
  }
  return out;
}

}  // namespace

// What a get or a borrow needs from the resolution of a ref.
struct AgentCore::Resolved {
  TensorRef ref;        // with its publication (a pending ref once fulfilled)
  std::string name;     // the transport used (after a fallback)
  TensorTransport* transport = nullptr;
  bool socket = false;  // the owner streams it (the built-in path)
  bool local = false;   // the owner is on this host (a lease lane)
  std::shared_ptr<Peer> peer;
  GroupTransport* group = nullptr;  // two-sided: the transport, and the owner's rank in its group
  int owner_rank = -1;
};

std::string AgentCore::context(const char* op, const TensorRef& ref) const {
  return std::string(op) + " of " + ref.describe() + " on " + who();
}

void AgentCore::verify_own(const TensorRef& ref, const char* op) const {
  if (!options.secret.empty() && !ref.verify(options.secret)) {
    throw Error(ErrorCode::kInvalidArgument,
                context(op, ref) + ": the ref is " +
                    (ref.is_signed() ? "signed with another secret" : "not signed") +
                    " (this agent only takes refs signed with its secret)");
  }
}

AgentCore::Resolved AgentCore::resolve(const TensorRef& ref, const GetOptions& opts,
                                       const char* op) {
  Resolved r;
  verify_own(ref, op);
  r.ref = ref;
  r.name = ref.transport();
  r.local = ref.owner().same_host(identity);
  if (r.name == "socket") check_targets(*this, op, ref, opts.targets);
  if (r.name != "socket") {
    TensorTransport& t = transport(r.name);  // kUnavailable when not registered
    check_targets(*this, op, ref, opts.targets, t.traits().cuda);
    auto* group = dynamic_cast<GroupTransport*>(&t);
    bool member = false;
    const int owner_rank = group != nullptr ? group->check_member(ref, &member) : -1;
    if (group != nullptr && !member) {
      if (!opts.allow_fallback || (!r.local && ref.owner().tcp_endpoint.empty()) ||
          t.traits().cuda) {
        try {
          group->check_member(ref, nullptr);  // throws, naming the group
        } catch (const Error& e) {
          rethrow_with(context(op, ref), e);
        }
      }
      TUTTI_LOG_DEBUG("direct transport: {}: not in the group, falls back to the socket",
                      context(op, ref));
      r.name = "socket";
    } else if (group != nullptr) {
      r.transport = &t;
      r.group = group;
      r.owner_rank = owner_rank;
    } else if (!t.traits().cross_host && !r.local) {
      if (!opts.allow_fallback || ref.owner().tcp_endpoint.empty()) {
        throw Error(ErrorCode::kUnavailable,
                    context(op, ref) + ": transport '" + r.name + "' works on one host, and " +
                        owner_text(ref.owner()) + " is on another host, network or pid namespace" +
                        (ref.owner().tcp_endpoint.empty()
                             ? " (and does not listen on TCP for the socket transport)"
                             : " (GetOptions::allow_fallback uses the socket transport)"));
      }
      TUTTI_LOG_DEBUG("direct transport: {}: on another host, falls back to the socket",
                      context(op, ref));
      r.name = "socket";
    } else {
      r.transport = &t;
    }
  }
  r.socket = r.name == "socket";
  r.peer = peer_for(ref.owner(), r.local);
  if (r.local && (r.peer->owner.pid != ref.owner().pid ||
                  r.peer->owner.start_time != ref.owner().start_time)) {
    throw Error(ErrorCode::kInvalidArgument,
                context(op, ref) + ": the ref names pid " + std::to_string(ref.owner().pid) +
                    " for an agent that runs as " + owner_text(r.peer->owner));
  }
  return r;
}

Received AgentCore::get(const TensorRef& ref, const GetOptions& opts,
                        const std::atomic<bool>* cancelled_in) {
  std::atomic<bool> own_flag{false};
  std::atomic<bool>* flag = cancelled_in != nullptr ? const_cast<std::atomic<bool>*>(cancelled_in)
                                                    : &own_flag;
  ActiveGet active_get(*this, flag);
  const auto deadline = deadline_after(opts.timeout.count() > 0 ? opts.timeout : fetch_timeout);
  try {
    if (ref.owner().uuid == identity.uuid) {
      verify_own(ref, "get");
      const bool cuda = !ref.tensors().empty() && ref.tensors()[0].device.type == DeviceType::kCUDA;
      if (cuda && !opts.targets.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "the ref is this agent's own CUDA object: get it without targets (its own "
                    "tensors) and copy on your stream");
      }
      check_targets(*this, "get", ref, opts.targets);
      return get_own(ref, opts.targets, false, deadline, *flag).first;
    }
    Resolved r = resolve(ref, opts, "get");
    Received out;
    std::vector<TensorView> targets = opts.targets;
    if (targets.empty() && r.transport != nullptr && r.transport->traits().cuda) {
      throw Error(ErrorCode::kInvalidArgument,
                  "transport '" + r.name + "' receives into CUDA memory: give targets");
    }
    if (targets.empty()) targets = allocate_targets(ref, out.storage_);
    PeerLink link(*this, r.peer, deadline, flag, ref.object());
    link.set_transport(r.name);
    if (r.socket) {
      link.set_stream_counts(true);
      link.stream(targets);
    } else if (r.group != nullptr) {
      get_two_sided(r, link, targets, deadline, *flag);
    } else {
      LeaseGuard lease(*this, r, take_lease(r, link, deadline, *flag));
      r.transport->fetch(FetchRequest{r.ref, link, targets, false, deadline, *flag, opts.stream});
      lease.complete(link);
    }
    out.views_ = std::move(targets);
    return out;
  } catch (const Error& e) {
    const std::string context = this->context("get", ref);
    if (flag->load() && e.code() != ErrorCode::kInvalidArgument) {
      throw Error(ErrorCode::kAborted, context + ": cancelled (" + e.what() + ")");
    }
    if (e.code() == ErrorCode::kTimeout && Clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout,
                  context + ": not done after " +
                      std::to_string((opts.timeout.count() > 0 ? opts.timeout : fetch_timeout).count()) +
                      " ms, waiting for " + owner_text(ref.owner()) + " (" + e.what() + ")");
    }
    rethrow_io(context, ref.owner(), identity, e);
  }
}

Borrowed AgentCore::borrow(const TensorRef& ref, const GetOptions& opts) {
  std::atomic<bool> flag{false};
  ActiveGet active_get(*this, &flag);
  const auto deadline = deadline_after(opts.timeout.count() > 0 ? opts.timeout : fetch_timeout);
  if (!opts.targets.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                context("borrow", ref) + ": borrow takes no targets (use get)");
  }
  try {
    Borrowed out;
    if (ref.owner().uuid == identity.uuid) {
      verify_own(ref, "borrow");
      auto [received, lease] = get_own(ref, {}, true, deadline, flag);
      out.views_ = received.views_;
      out.lease_ = std::move(lease);
      return out;
    }
    Resolved r = resolve(ref, opts, "borrow");
    PeerLink link(*this, r.peer, deadline, &flag, ref.object());
    link.set_transport(r.name);
    if (r.socket || !r.transport->traits().can_borrow) {
      // Nothing to borrow in place: a private copy, held like a borrow.
      auto storage = std::make_shared<std::vector<std::shared_ptr<void>>>();
      std::vector<TensorView> views = allocate_targets(ref, *storage);
      if (r.transport != nullptr && r.transport->traits().cuda) {
        throw Error(ErrorCode::kInvalidArgument,
                    "transport '" + r.name + "' cannot lend views: get into CUDA targets");
      }
      if (r.socket) {
        link.set_stream_counts(true);
        link.stream(views);
      } else if (r.group != nullptr) {
        get_two_sided(r, link, views, deadline, flag);
      } else {
        LeaseGuard lease(*this, r, take_lease(r, link, deadline, flag));
        r.transport->fetch(FetchRequest{r.ref, link, views, false, deadline, flag, opts.stream});
        lease.complete(link);
      }
      out.views_ = std::move(views);
      out.lease_ = std::make_unique<HeldLease>();
      out.lease_->end = [storage] {};
      return out;
    }
    LeaseGuard guard(*this, r, take_lease(r, link, deadline, flag));
    static const std::vector<TensorView> kNone;
    FetchResult fetched =
        r.transport->fetch(FetchRequest{r.ref, link, kNone, true, deadline, flag, opts.stream});
    if (fetched.views.size() != ref.tensors().size()) {
      throw Error(ErrorCode::kInternal, "transport '" + r.name + "' lent " +
                                            std::to_string(fetched.views.size()) + " views for " +
                                            std::to_string(ref.tensors().size()) + " tensors");
    }
    // From here the Borrowed holds the lease: it ends when the borrow does (or at once, should
    // counting the get fail below).
    const Lease lease = guard.release();
    out.views_ = std::move(fetched.views);
    out.lease_ = std::make_unique<HeldLease>();
    auto self = shared_from_this();
    out.lease_->end = [self, r, lease, keep = std::move(fetched.keep)]() mutable {
      if (self->forked()) return;  // the lease is the parent's
      try {
        PeerLink link(*self, r.peer, deadline_after(std::chrono::seconds(1)), nullptr,
                      r.ref.object());
        self->end_lease(*r.peer, link, r.ref.object(), lease, false);
      } catch (const std::exception& e) {
        TUTTI_LOG_DEBUG("direct transport: ending a borrow of {}: {}", r.ref.describe(), e.what());
      }
    };
    count_get(*r.peer, link, r.ref.object(), lease);
    return out;
  } catch (const Error& e) {
    const std::string context = this->context("borrow", ref);
    if (flag.load()) throw Error(ErrorCode::kAborted, context + ": cancelled (" + e.what() + ")");
    rethrow_io(context, ref.owner(), identity, e);
  }
}

// This agent's own object: no copy unless targets are given; `lease` holds the object.
std::pair<Received, std::unique_ptr<HeldLease>> AgentCore::get_own(
    const TensorRef& ref, const std::vector<TensorView>& targets, bool borrow,
    Clock::time_point deadline, const std::atomic<bool>& cancelled) {
  const uint64_t id = ref.object().id;
  const uint32_t gen = ref.object().generation;
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    auto it = objects.find(id);
    if (it == objects.end() || it->second.generation != gen) {
      throw Error(ErrorCode::kInvalidUsage, "the object " + freed_text_locked(id));
    }
    Object& o = it->second;
    if (o.state == kSlotFailed) {
      throw Error(ErrorCode::kRemoteError, "the owner failed it: " + o.failure);
    }
    if (o.state == kSlotRetiring) {
      throw Error(ErrorCode::kInvalidUsage, "the object is being freed (nothing pins it)");
    }
    if (o.state == kSlotLive) break;
    if (cancelled.load()) throw Error(ErrorCode::kAborted, "cancelled");
    if (Clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout, "the object is still reserved (never fulfilled)");
    }
    changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(20)));
  }
  Object& o = objects.find(id)->second;
  // The ref may be stale or made up: it must describe the object exactly, and targets may not
  // overlap its tensors.
  const auto& metas = ref.tensors();
  bool same = metas.size() == o.metas.size();
  for (size_t i = 0; same && i < metas.size(); ++i) {
    same = metas[i].dtype == o.metas[i].dtype && metas[i].shape == o.metas[i].shape &&
           metas[i].device == o.metas[i].device;
  }
  if (!same) {
    throw Error(ErrorCode::kInvalidArgument,
                "the ref describes " + std::to_string(metas.size()) +
                    " tensor(s) unlike the object's (" + std::to_string(o.metas.size()) +
                    "): it was altered or made up");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto* a = static_cast<const char*>(targets[i].data());
    const auto* b = static_cast<const char*>(o.tensors[i].data());
    const size_t n = targets[i].nbytes();
    if (n > 0 && a < b + n && b < a + n) {
      throw Error(ErrorCode::kInvalidArgument,
                  "target " + std::to_string(i) + " overlaps the object's own tensor");
    }
  }
  ++o.local_leases;
  if (o.expected_gets > 0 && --o.expected_gets == 0) slots.slot(o.slot).flags.store(0);
  const std::vector<TensorView> tensors = o.tensors;
  lock.unlock();
  auto lease = std::make_unique<HeldLease>();
  std::weak_ptr<AgentCore> weak = weak_from_this();
  lease->end = [weak, id] {
    auto self = weak.lock();
    if (self && !self->forked()) {
      std::lock_guard<std::mutex> lock(self->mutex);
      auto it = self->objects.find(id);
      if (it != self->objects.end()) {
        --it->second.local_leases;
        self->settle_locked(it->second);
      }
    }
  };
  Received out;
  if (!targets.empty()) {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (tensors[i].nbytes() > 0) std::memcpy(targets[i].data(), tensors[i].data(), tensors[i].nbytes());
    }
    out.views_ = targets;
    lease.reset();  // copied: the hold ends now
    return {std::move(out), nullptr};
  }
  out.views_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta& m = ref.tensors()[i];
    out.views_.emplace_back(tensors[i].data(), m.dtype, m.shape, m.device);
  }
  if (!borrow) {
    // A get without targets shares the owner's tensors; the Received holds the object.
    std::shared_ptr<HeldLease> held(std::move(lease));
    out.storage_.push_back(held);
    return {std::move(out), nullptr};
  }
  return {std::move(out), std::move(lease)};
}

AgentCore::Lease AgentCore::take_lease(Resolved& r, PeerLink& link, Clock::time_point deadline,
                                       const std::atomic<bool>& cancelled) {
  const ObjectId object = r.ref.object();
  bool waited = false;
  while (true) {
    if (cancelled.load()) throw Error(ErrorCode::kAborted, "cancelled");
    uint32_t state = kSlotFree;
    if (r.local && r.transport->traits().one_sided) {
      // Read under the peer's lock: another get's first connection may be setting it.
      SlotView* slot_page = r.peer->slot_view();
      if (slot_page == nullptr) {
        // The first connection brings the owner's slot page.
        auto conn = checkout(*r.peer, deadline, &cancelled);
        checkin(*r.peer, std::move(conn));
        slot_page = r.peer->slot_view();
      }
      if (slot_page != nullptr && !r.ref.is_pending()) {
        const int entry = r.peer->lane->acquire(*slot_page, object.slot, object.generation, state);
        if (entry >= 0) {
          if (r.peer->owner_exited()) {
            r.peer->lane->release(*slot_page, entry, object.slot);
            throw Error(ErrorCode::kIoError, owner_text(r.ref.owner()) +
                                                 " is gone (its process exited or died)");
          }
          return Lease{entry, false};
        }
      } else {
        state = kSlotReserved;
      }
    } else {
      // No lane (another host, or a two-sided transport): the owner keeps the hold.
      WireWriter w;
      w.u64(object.id);
      w.u32(object.generation);
      if (!r.ref.is_pending()) {
        Message m = link.request(MsgType::kLease, w.out());
        WireReader rd(m.payload, "a lease reply");
        state = rd.u32("state");
        if (state == kSlotLive) return Lease{-1, true};
      } else {
        state = kSlotReserved;
      }
    }
    // Not live: ask the owner what it is (waiting for a reserved one to be fulfilled).
    if (state == kSlotFree) {
      throw Error(ErrorCode::kInvalidUsage, "the object was freed at its owner (its handles "
                                            "were released and its expected gets were done)");
    }
    if (state == kSlotRetiring) {
      throw Error(ErrorCode::kInvalidUsage,
                  "the object is being freed at its owner (no handle, expected get or keep_for "
                  "holds it)");
    }
    if (waited && state != kSlotReserved && state != kSlotFailed) {
      throw Error(ErrorCode::kInternal, "the object's state changed to " + std::to_string(state) +
                                            " after its owner said it was live");
    }
    WireWriter w;
    w.u64(object.id);
    w.u32(object.generation);
    w.u64(wire_timeout(deadline));
    Message m = link.request(MsgType::kWait, w.out());
    WireReader rd(m.payload, "a wait reply from " + owner_text(r.ref.owner()));
    const uint32_t now_state = rd.u32("state");
    if (now_state == kSlotFailed) {
      throw Error(ErrorCode::kRemoteError, "the owner failed it: " + rd.str32("message", 1u << 20));
    }
    if (now_state != kSlotLive) {
      throw Error(ErrorCode::kInvalidUsage, "the object is being freed at its owner");
    }
    if (r.ref.is_pending()) {
      Publication pub;
      pub.blob = rd.str32("transport bytes", TensorRef::kMaxBlob);
      const uint32_t n = rd.u32("tensors");
      if (n != r.ref.tensors().size()) {
        throw Error(ErrorCode::kInternal, "the owner describes " + std::to_string(n) +
                                              " tensors, the ref " +
                                              std::to_string(r.ref.tensors().size()));
      }
      for (uint32_t i = 0; i < n; ++i) {
        const uint16_t region = rd.u16("region");
        pub.places.emplace_back(region, rd.u64("offset"));
      }
      r.ref = TensorRef(r.ref.owner(), object, r.ref.transport(), r.ref.tensors(), pub.places,
                        pub.blob, r.ref.is_two_sided(), false);
    }
    waited = true;
  }
}

void AgentCore::count_get(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease) {
  if (lease.entry >= 0 &&
      (peer.slot_view()->slot(object.slot).flags.load() & kSlotCountsGets) == 0) {
    return;
  }
  WireWriter w;
  w.u64(object.id);
  w.u32(object.generation);
  link.request(MsgType::kGot, w.out());
}

void AgentCore::end_lease(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease,
                          bool completed) {
  // The hold ends first, whatever becomes of the messages after it; the count of expected gets
  // keeps the object until the owner has counted this one.
  if (lease.entry >= 0) {
    const SlotView* slots = peer.slot_view();
    const bool counts = completed && (slots->slot(object.slot).flags.load() & kSlotCountsGets) != 0;
    const bool owner_waits = peer.lane->release(*slots, lease.entry, object.slot);
    if (counts) {
      count_get(peer, link, object, Lease{-1, false});  // the owner settles the object on it
    } else if (owner_waits) {
      link.request(MsgType::kReleased, "");  // the owner waits on it: look again now
    }
  } else if (lease.remote) {
    WireWriter w;
    w.u64(object.id);
    w.u32(object.generation);
    link.request(MsgType::kUnlease, w.out());
    if (completed) count_get(peer, link, object, lease);
  }
}

LeaseGuard::LeaseGuard(AgentCore& core, const AgentCore::Resolved& r, AgentCore::Lease lease)
    : core_(core), r_(r), lease_(lease) {}

LeaseGuard::~LeaseGuard() {
  if (!held_) return;
  try {
    PeerLink link(core_, r_.peer, deadline_after(std::chrono::seconds(1)), nullptr, r_.ref.object());
    core_.end_lease(*r_.peer, link, r_.ref.object(), lease_, false);
  } catch (const std::exception& e) {
    TUTTI_LOG_DEBUG("direct transport: giving back a lease on {}: {}", r_.ref.describe(), e.what());
  }
}

void LeaseGuard::complete(PeerLink& link) {
  held_ = false;
  core_.end_lease(*r_.peer, link, r_.ref.object(), lease_, true);
}

AgentCore::Lease LeaseGuard::release() {
  held_ = false;
  return lease_;
}

void AgentCore::get_two_sided(Resolved& r, PeerLink& link, const std::vector<TensorView>& targets,
                              Clock::time_point deadline, const std::atomic<bool>& cancelled) {
  GroupTransport& g = *r.group;
  const int owner_rank = r.owner_rank;
  const ObjectId object = r.ref.object();
  const std::string owner_id = r.ref.owner().uuid_text();
  uint64_t seq = 0;  // this rank's number for the transfer, when it leads the pair
  uint64_t incarnation = 0;
  bool sent = false;
  Message m;
  try {
    m = link.exchange(MsgType::kFetch, [&] {
      seq = g.lead(owner_rank, owner_id, &incarnation);
      WireWriter w;
      w.u64(object.id);
      w.u32(object.generation);
      w.u64(wire_timeout(deadline));
      w.str8(r.name);
      w.str8(g.set());
      w.u64(incarnation);
      w.u32(static_cast<uint32_t>(g.rank()));
      w.u64(seq);
      return std::move(w.out());
    }, &sent);
  } catch (const Error& e) {
    // The owner may have numbered (and queued) the transfer: the pair is out of step.
    if (sent || seq > 0) {
      g.abort("a fetch from " + owner_text(r.ref.owner()) + " (rank " +
              std::to_string(owner_rank) + ") broke off: " + e.what());
    }
    throw;
  }
  if (m.type == MsgType::kError) {
    if (seq > 0) g.abort("the owner refused a numbered fetch it could not read");
    throw_error_payload(m.payload);
  }
  WireReader rd(m.payload, "a fetch grant from " + owner_text(r.ref.owner()));
  const uint8_t status = rd.u8("status");
  if (status != 0) {
    const std::string error = rd.str32("error", 1u << 20);
    if (seq > 0 && status == 1) g.skip(owner_rank, owner_id, seq, incarnation);
    if (seq > 0 && status != 1) g.abort("the owner refused a fetch before it numbered it");
    throw_error_payload(error);
  }
  const uint64_t granted = rd.u64("number");
  auto job = g.enqueue(GroupJob::Kind::kRecv, owner_rank, owner_id, granted, incarnation, targets,
                       deadline, nullptr);
  g.wait(*job, deadline, cancelled,
         owner_text(r.ref.owner()) + " (rank " + std::to_string(owner_rank) + ")");
}

Fetch AgentCore::get_async(const TensorRef& ref, const GetOptions& opts) {
  Fetch f;
  f.state_ = std::make_shared<FetchState>();
  auto state = f.state_;
  auto self = shared_from_this();
  std::thread([self, state, ref, opts] {
    Received result;
    std::exception_ptr error;
    try {
      result = self->get(ref, opts, &state->cancelled);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->result = std::move(result);
    state->error = error;
    state->finished = true;
    state->cv.notify_all();
  }).detach();
  return f;
}

}  // namespace tutti::detail
