// The owner's server: one thread per consumer connection answering the agents' messages
// (agent_core.h; the hello: handshake.h; its listeners and housekeeping: owner_accept.cc).
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "transfer/agent_core.h"
#include "transfer/handshake.h"
#include "transfer/publication_wire.h"  // kWait
#include "transfer/wire.h"
#include "util/deadline.h"
#include "util/host_identity.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// Settles object `id` (every object: kAll; nothing: kNone) when the scope ends, so after the
// answer to the message that led to it went, or failed to: settling may free the object, and an
// owner waiting for that (wait_tensor_freed) may exit at once, before a later answer went, and
// fail a get that has its bytes ("closed the connection"; OwnerExits.TheGetThatFreesTheObject
// Succeeds).
struct SettleAfter {
  static constexpr uint64_t kNone = 0;  // object ids count from 1
  static constexpr uint64_t kAll = ~uint64_t{0};
  SettleAfter(AgentCore& c, uint64_t i) : core(c), id(i) {}
  ~SettleAfter() {
    if (id == kNone) return;
    std::lock_guard<std::mutex> lock(core.mutex);
    if (id == kAll) {
      core.settle_all_locked();
    } else if (auto it = core.objects.find(id); it != core.objects.end()) {
      core.settle_locked(it->second);
    }
  }
  AgentCore& core;
  const uint64_t id;
};

// The agent's holds for a transport that answers a call (TransportOwner).
class Holds final : public TransportOwner {
 public:
  Holds(AgentCore& core, const TensorTransport& t) : core_(core), t_(t) {}
  HeldObject hold(ObjectId object, Clock::time_point deadline) override {
    return core_.hold_for(t_, object, deadline);
  }

 private:
  AgentCore& core_;
  const TensorTransport& t_;
};

// One consumer's connection, served on its own thread until the consumer goes or the agent
// stops: the hello first, then one handler per request.
class Session {
 public:
  Session(AgentCore& core, std::unique_ptr<Connection> conn, bool local)
      : core_(core), conn_(std::move(conn)), local_(local), fd_(conn_->fd()) {}

  void run() {
    try {
      if (!local_) start_tls();
      // After an answer the consumer's next request often follows at once (a get's next step,
      // or its next get): polled for a while (kReplySpin), it is read without a wake-up. Only
      // while the consumer's last request came within that while: one that keeps a slower pace
      // costs no polling.
      // Between requests the loop looks at the agent's stop every second; a request whose first
      // bytes came is read whole (up to the fetch timeout), never given up half read.
      bool spin = true;
      while (!core_.stopping) {
        // An error (the consumer went or stalled in a request, or the agent's stop shut the
        // socket) ends the connection below.
        const auto answered = Clock::now();
        const auto idle_until = answered + std::chrono::seconds(1);
        std::optional<Message> m =
            conn_->receive_next(idle_until, deadline_after(core_.fetch_timeout, idle_until),
                                nullptr, spin ? kReplySpin : std::chrono::microseconds(0));
        if (!m) {
          spin = false;
          continue;
        }
        spin = Clock::now() - answered < kReplySpin;
        if (!answer(*m)) break;
      }
    } catch (const std::exception& e) {
      try {
        TUTTI_LOG_DEBUG("direct transport: {} stops serving {}: {}", core_.who(), conn_->peer(),
                        e.what());
      } catch (...) {  // out of memory for the message: the connection ends all the same
      }
    } catch (...) {
    }
    finish();  // whatever ended the loop: an exception out of this thread ends the process
  }

 private:
  // A remote consumer's connection in TLS first, when this agent has it; TLS on one side only:
  // the other is told in the clear, and the connection ends.
  void start_tls() {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    const bool tls_hello = looks_like_tls(conn_->peek(3, deadline));
    if (tls_hello != (core_.tls_server != nullptr)) {
      const std::string who = core_.who();
      const Error e(ErrorCode::kInvalidArgument,
                    core_.tls_server ? who +
                                           " takes TLS connections only (TUTTI_TRANSFER_TLS=1 "
                                           "on its side): the consumer needs it too"
                                     : who +
                                           " does not use TLS, and the consumer does "
                                           "(TUTTI_TRANSFER_TLS must be the same on both)");
      TUTTI_LOG_WARN("direct transport: {} refused {}: {}", who, conn_->peer(), e.what());
      conn_->send(MsgType::kError, error_payload(e), {}, deadline);
      throw e;
    }
    if (core_.tls_server) conn_->start_tls(core_.tls_server.get(), /*server=*/true, deadline);
  }

  // One message; false ends the connection. An error is the consumer's answer, except a broken
  // connection.
  bool answer(Message& m) {
    if (m.type != MsgType::kHello) {
      for (int f : m.fds) ::close(f);  // only a hello carries descriptors
      m.fds.clear();
      if (!consumer_) {
        // Nothing is served before a hello that passed: answer once, then hang up.
        const Error e(ErrorCode::kInvalidUsage,
                      core_.who() + " serves nothing to a connection that has not said hello");
        conn_->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(1));
        return false;
      }
    }
    try {
      WireReader r(m.payload, "a request to " + core_.who());
      switch (m.type) {
        case MsgType::kHello: on_hello(m); break;
        case MsgType::kCall: on_call(r); break;
        case MsgType::kWait: on_wait(r); break;
        case MsgType::kGot: on_got(r); break;
        case MsgType::kReleased: on_released(); break;
        case MsgType::kLease: on_lease(r); break;
        case MsgType::kUnlease: on_unlease(r); break;
        case MsgType::kStream: on_stream(r); break;
        case MsgType::kPublish: on_publish(r); break;
        default:
          throw Error(ErrorCode::kInvalidArgument, core_.who() + " got a message of unknown type " +
                                                       std::to_string(static_cast<int>(m.type)));
      }
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIoError) throw;  // the connection is gone
      conn_->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(5));
    }
    return true;
  }

  void reply(const std::string& payload, const std::vector<int>& fds = {}) {
    on_wire(
        [&] { conn_->send(MsgType::kReply, payload, fds, deadline_after(core_.fetch_timeout)); });
  }

  // What goes to the consumer: a send that fails part-way (a timeout, a cancel) leaves the
  // connection out of step, so it ends the connection as a broken one does, rather than carry an
  // error frame after half a message.
  template <typename Send>
  void on_wire(Send&& send) {
    try {
      send();
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kIoError) throw;
      throw Error(ErrorCode::kIoError, e.what());
    }
  }

  void on_hello(Message& m) {
    if (consumer_) {
      for (int f : m.fds) ::close(f);
      throw Error(ErrorCode::kInvalidUsage, "a second hello on one connection");
    }
    const HelloAccepted hello =
        accept_hello(*conn_, m, core_.identity, core_.options.secret, local_, core_.fetch_timeout);
    conn_->set_peer("agent '" + hello.consumer.name + "'");
    admit(hello);
    std::vector<int> fds;
    if (local_) fds.push_back(core_.slots.fd());
    on_wire([&] {
      answer_hello(*conn_, hello, core_.identity, core_.options.secret, fds,
                   deadline_after(core_.fetch_timeout));
    });
  }

  // The consumer a hello admitted, known from before (another connection) or new; on one host
  // with its lease lane and a pidfd for its exit. Before the answer: a lease it takes once
  // answered is in a lane the owner already looks at.
  void admit(const HelloAccepted& hello) {
    const AgentIdentity& them = hello.consumer;
    std::lock_guard<std::mutex> lock(core_.mutex);
    auto& c = core_.consumers[them.uuid_text()];
    if (!c) {
      c = std::make_shared<Consumer>();
      c->identity = them;
      if (local_) {
        // Its exit shows on a pidfd, taken while the pid is still its process.
        const int pfd =
            static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(them.pid), 0));
        if (pfd >= 0 && process_start_time(static_cast<long>(them.pid)) == them.start_time) {
          c->pidfd = pfd;
        } else if (pfd >= 0) {
          ::close(pfd);
        }
      }
    }
    if (hello.lane_fd >= 0) {
      if (!c->lane) {
        c->lane = std::make_unique<LaneView>(hello.lane_fd);
      } else {
        ::close(hello.lane_fd);
      }
    }
    consumer_ = c;
    ++c->connections;
  }

  void on_call(WireReader& r) {
    const std::string name = r.str8("transport");
    const std::string request = r.str32("request", 1u << 24);
    struct Fds {  // the reply's descriptors: the transport's to give, closed here after
      std::vector<int> list;
      ~Fds() {
        for (int f : list) ::close(f);
      }
    } fds;
    TensorTransport& t = core_.transport(name);
    Holds holds(core_, t);
    // What the transport leaves for this thread after the reply (AnswerRequest::then): run
    // however the reply ends, since the transport counts on it.
    struct Then {
      std::function<void()> work;
      ~Then() {
        if (work) work();
      }
    } then;
    AnswerRequest request_for{request, consumer_->identity, &fds.list, holds, &then.work};
    reply(t.answer_with(request_for), fds.list);
  }

  void on_wait(WireReader& r) {
    const uint64_t id = r.u64("id");
    const uint32_t gen = r.u32("generation");
    const auto deadline = wire_answer_deadline(r.u64("timeout"));  // so that a refusal reaches it
    WireWriter w;
    {
      std::unique_lock<std::mutex> lock(core_.mutex);
      // A consumer that dies while it waits must not keep its holds.
      core_.await_fulfilled_locked(lock, id, gen, deadline, [&] {
        if (hung_up(fd_)) throw Error(ErrorCode::kIoError, "the consumer hung up while waiting");
      });
      Object& o = core_.find_locked(id, gen);
      if (o.state == kSlotReserved) {
        throw Error(ErrorCode::kTimeout,
                    "object " + std::to_string(id) + " is still reserved (never fulfilled)");
      }
      if (o.state == kSlotRetiring && !o.published) {
        throw Error(ErrorCode::kInvalidUsage,
                    "object " + std::to_string(id) + " was released before it was fulfilled");
      }
      w.u32(o.state);
      if (o.state == kSlotFailed) {
        w.str32(o.failure);
      } else {
        write_publication(w, o.publication, o.metas.size());
      }
    }
    reply(w.out());
  }

  // A consumer on another host: the object on its transport too (across_hosts.cc). A consumer
  // that dies while it waits must not keep its holds.
  void on_publish(WireReader& r) {
    reply(core_.answer_publish(r, [&] {
      if (hung_up(fd_)) throw Error(ErrorCode::kIoError, "the consumer hung up while waiting");
    }));
  }

  // kGot, kReleased and kUnlease are answered before the settling they lead to (SettleAfter):
  // settling may free an object, and an owner waiting for that may exit.
  void on_got(WireReader& r) {
    const uint64_t id = r.u64("id");
    const uint32_t gen = r.u32("generation");
    SettleAfter settle(core_, id);
    {
      std::lock_guard<std::mutex> lock(core_.mutex);
      auto it = core_.objects.find(id);
      if (it != core_.objects.end() && it->second.generation == gen) {
        core_.count_get_locked(it->second);
      }
    }
    reply("");
  }

  void on_released() {
    SettleAfter settle(core_, SettleAfter::kAll);
    reply("");
  }

  // A hold the owner keeps for a consumer without a lease lane (another host, or a two-sided
  // transport); the reply is the object's state (only a live one is held).
  void on_lease(WireReader& r) {
    const uint64_t id = r.u64("id");
    const uint32_t gen = r.u32("generation");
    WireWriter w;
    {
      std::lock_guard<std::mutex> lock(core_.mutex);
      Object& o = core_.find_locked(id, gen);
      if (o.state == kSlotLive) {
        ++o.local_leases;
        ++consumer_->leases[id];
      }
      w.u32(o.state);
    }
    reply(w.out());
  }

  void on_unlease(WireReader& r) {
    const uint64_t id = r.u64("id");
    r.u32("generation");
    {
      std::lock_guard<std::mutex> lock(core_.mutex);
      auto held = consumer_->leases.find(id);
      if (held != consumer_->leases.end()) {
        if (--held->second == 0) consumer_->leases.erase(held);
        if (auto it = core_.objects.find(id); it != core_.objects.end()) {
          --it->second.local_leases;
        }
      }
    }
    SettleAfter settle(core_, id);
    WireWriter w;
    w.u32(kSlotLive);
    reply(w.out());
  }

  // The socket transport: the object's bytes on this connection, after a header of their total.
  void on_stream(WireReader& r) {
    const uint64_t id = r.u64("id");
    const uint32_t gen = r.u32("generation");
    const auto deadline = wire_deadline(r.u64("timeout"));
    const bool counts = r.u8("counts") != 0;
    const std::vector<TensorView> tensors = core_.hold(id, gen, deadline);
    std::vector<iovec> parts;
    uint64_t total = 0;
    for (const TensorView& t : tensors) {
      parts.push_back({t.data(), t.nbytes()});
      total += t.nbytes();
    }
    try {
      WireWriter w;
      w.u64(total);
      reply(w.out());
      on_wire([&] { conn_->send_raw(parts, deadline); });
    } catch (...) {
      core_.release_hold(id, false);
      throw;
    }
    core_.release_hold(id, counts);
  }

  // A local consumer's last connection closing says little: a live one may have dropped it (a
  // cancelled or timed-out request). Its process's exit is what ends its holds; a dying process
  // closes its sockets just before its pidfd reads as exited, so look for a moment.
  void finish() {
    bool exited = false;
    int pidfd = -1;
    {
      std::lock_guard<std::mutex> lock(core_.mutex);
      if (consumer_ && consumer_->connections == 1 && consumer_->pidfd >= 0) {
        pidfd = consumer_->pidfd;
      }
    }
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      exited = ::poll(&p, 1, 50) > 0;
    }
    std::lock_guard<std::mutex> lock(core_.mutex);
    if (consumer_ && --consumer_->connections == 0 && (consumer_->pidfd < 0 || exited)) {
      try {
        core_.drop_consumer_locked(consumer_->identity.uuid_text());
      } catch (...) {  // out of memory: its leases stay (a local one's go when its process exits)
      }
    }
    core_.serving_fds.erase(fd_);
    conn_.reset();
    core_.serving_thread_ends_locked();
  }

  AgentCore& core_;
  std::unique_ptr<Connection> conn_;
  const bool local_;
  const int fd_;
  std::shared_ptr<Consumer> consumer_;
};

}  // namespace

void AgentCore::serve(std::unique_ptr<Connection> connection, bool local) {
  Session(*this, std::move(connection), local).run();
}

}  // namespace tutti::detail
