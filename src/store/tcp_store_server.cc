#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <set>
#include <thread>
#include <unordered_map>

#include "store/store_stream.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "tutti/error.h"
#include "tutti/tcp_store.h"
#include "util/crypto.h"
#include "util/deadline.h"
#include "util/logging.h"
#include "util/tcp_link.h"
#include "util/tls.h"

namespace tutti {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
namespace proto = detail::tcp_store;

namespace {
// A client must finish its handshake within this, and keep a message it has begun moving (some
// bytes at least this often).
constexpr auto kStallTimeout = std::chrono::seconds(10);
// A response that the client does not read within this closes the connection.
constexpr auto kWriteTimeout = std::chrono::seconds(30);
// A wait may last at most this long, whatever the client asks; a TCPStore asks again.
constexpr int64_t kMaxWaitMs = int64_t(24) * 3600 * 1000;
// Accepting pauses after a failure (out of file descriptors...), doubling up to the maximum.
constexpr auto kFirstAcceptPause = std::chrono::milliseconds(10);
constexpr auto kMaxAcceptPause = std::chrono::milliseconds(1000);
// What both sides derive the TLS key under (util/tls.h).
constexpr const char* kTlsLabel = "tutti store";
// A repeated warning is written at most once per this.
constexpr auto kWarningInterval = std::chrono::seconds(10);

std::string hex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// A warning that may recur in a burst: the first is written, then at most one per interval,
// saying how many were left out meanwhile. Used on the server's thread only.
class RateLimitedWarning {
 public:
  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    const auto now = Clock::now();
    if (written_ && now - last_ < kWarningInterval) {
      ++suppressed_;
      return;
    }
    const std::string text = fmt::format(format, std::forward<Args>(args)...);
    if (suppressed_ > 0) {
      TUTTI_LOG_WARN("{} ({} more like this in the last {} s)", text, suppressed_,
                     std::chrono::duration_cast<std::chrono::seconds>(now - last_).count());
    } else {
      TUTTI_LOG_WARN("{}", text);
    }
    written_ = true;
    last_ = now;
    suppressed_ = 0;
  }

 private:
  bool written_ = false;
  Clock::time_point last_;
  uint64_t suppressed_ = 0;
};
}  // namespace

class Session;

struct TCPStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_timer{io};
  std::thread thread;
  pid_t owner_pid = ::getpid();
  std::string host;
  TCPStoreServerOptions options;
  std::unique_ptr<asio::ssl::context> tls;  // every connection's, with options.tls
  std::string id;                           // random, per instance: sent in every hello
  std::string nonce;                        // hex(id): the key "tutti/store-nonce"
  uint16_t port = 0;
  std::unordered_map<std::string, std::string> data;
  std::set<std::shared_ptr<Session>> sessions;
  std::set<std::shared_ptr<Session>> waiting;  // sessions blocked in a wait
  Clock::duration accept_pause{};              // zero while accepting works
  RateLimitedWarning accept_warning, cap_warning, memory_warning, refused_warning;

  // Mirrors for stats(), written on the server's thread, read from any.
  std::atomic<size_t> connections{0};
  std::atomic<size_t> waiting_count{0};
  std::atomic<size_t> buffered_bytes{0};
  std::atomic<uint64_t> accept_errors{0};
  std::atomic<uint64_t> refused_connections{0};
  std::atomic<uint64_t> idle_closed{0};

  void accept();
  void notify_waiters();
  void session_ended(const std::shared_ptr<Session>& session);

  // Reserves `n` more bytes of message buffer on behalf of a connection; false when the total
  // cap would be passed.
  bool reserve(size_t n) {
    const size_t now = buffered_bytes.load(std::memory_order_relaxed);
    if (now + n > options.max_buffered_bytes) return false;
    buffered_bytes.store(now + n, std::memory_order_relaxed);
    return true;
  }
  void release(size_t n) { buffered_bytes.fetch_sub(n, std::memory_order_relaxed); }

  size_t max_message_bytes() const {
    return std::min<size_t>(options.max_message_bytes, proto::kMaxBodyBytes);
  }
};

// One client connection. Lives on the server's single I/O thread: no locks.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TCPStoreServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket), server.tls.get()), timer_(server.io) {}

  // TLS first where the server has it (within the handshake's stall timeout), then the hello.
  void start() {
    arm(kStallTimeout, Timer::kStall);
    auto self = shared_from_this();
    socket_.async_handshake(/*server=*/true, [self](asio::error_code ec) {
      if (ec) return self->close("TLS handshake failed");
      self->greet();
    });
  }

  void greet() {
    nonce_ = detail::random_bytes(proto::kNonceBytes);
    const auto idle_ms = std::clamp<int64_t>(server_.options.idle_timeout.count(), 0, UINT32_MAX);
    proto::Writer hello;
    hello.u32(proto::kMagic).u16(proto::kVersion).raw(server_.id.data(), server_.id.size());
    hello.u32(static_cast<uint32_t>(idle_ms))
        .u32(static_cast<uint32_t>(server_.max_message_bytes()));
    hello.raw(nonce_.data(), nonce_.size());
    out_ = hello.body();
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
      if (ec) return self->close("handshake write failed");
      self->hello_.resize(proto::kClientHelloBytes);
      asio::async_read(socket_of(self), asio::buffer(self->hello_),
                       [self](asio::error_code ec2, size_t) {
                         if (ec2) return self->close("handshake read failed");
                         self->finish_handshake();
                       });
    });
  }

  const std::vector<std::string>& wait_keys() const { return wait_keys_; }

  // Called by the server when the keys this session waits for exist.
  void wake() {
    disarm();
    end_wait();
    respond(proto::Writer().u8(static_cast<uint8_t>(proto::Status::kOk)));
  }

  void close(const char* why) {
    if (closed_) return;
    closed_ = true;
    TUTTI_LOG_DEBUG("tcp store: closing connection: {}", why);
    asio::error_code ec;
    socket_.socket().shutdown(tcp::socket::shutdown_both, ec);
    socket_.socket().close(ec);
    timer_.cancel();
    release_body();
    end_wait();
    server_.session_ended(shared_from_this());
  }

  // What this connection asked to be set when it closes.
  std::vector<std::pair<std::string, std::string>>& on_close() { return on_close_; }

 private:
  enum class Timer { kStall, kIdle, kWait, kWrite };

  static detail::StoreStream& socket_of(const std::shared_ptr<Session>& s) { return s->socket_; }

  // A wait ends (answered, timed out, or its connection closed): its keys' bytes go back.
  void end_wait() {
    waiting_ = false;
    server_.release(wait_reserved_);
    wait_reserved_ = 0;
    std::vector<std::string>().swap(wait_keys_);
  }

  // One timer serves the handshake, the wait for a message, a partly received message, a wait
  // and a write, which never overlap; the generation counter makes a stale expiry harmless.
  void arm(Clock::duration after, Timer kind) {
    const uint64_t generation = ++timer_generation_;
    timer_.expires_after(after);
    auto self = shared_from_this();
    timer_.async_wait([self, generation, kind](asio::error_code ec) {
      if (ec || generation != self->timer_generation_ || self->closed_) return;
      switch (kind) {
        case Timer::kWait:
          self->end_wait();
          self->server_.waiting.erase(self);
          self->server_.waiting_count.store(self->server_.waiting.size(),
                                            std::memory_order_relaxed);
          self->respond(proto::Writer().u8(static_cast<uint8_t>(proto::Status::kTimeout)));
          break;
        case Timer::kIdle:
          self->server_.idle_closed.fetch_add(1, std::memory_order_relaxed);
          self->close("idle");
          break;
        case Timer::kStall:
        case Timer::kWrite: self->close("stalled"); break;
      }
    });
  }

  void disarm() {
    ++timer_generation_;
    timer_.cancel();
  }

  void finish_handshake() {
    proto::Reader r(hello_.data(), hello_.size());
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    std::string proof(proto::kProofBytes, '\0');
    for (auto& c : proof) c = static_cast<char>(r.u8());
    std::string().swap(hello_);
    bool ok = r.done() && magic == proto::kMagic && version == proto::kVersion;
    if (ok && !server_.options.secret.empty()) {
      const auto want = detail::hmac_sha256(server_.options.secret, nonce_);
      ok = detail::same_secret(want.data(), want.size(), proof.data(), proof.size());
    }
    if (!ok) {
      server_.refused_warning.warn("tcp store: refused a client (bad magic, version or secret)");
      out_ = std::string(1, static_cast<char>(proto::Status::kDenied));
      auto self = shared_from_this();
      asio::async_write(socket_, asio::buffer(out_),
                        [self](asio::error_code, size_t) { self->close("denied"); });
      return;
    }
    out_ = std::string(1, static_cast<char>(proto::Status::kOk));
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
      if (ec) return self->close("handshake reply failed");
      self->read_header();
    });
  }

  void read_header() {
    // Between messages a connection may be idle only so long, unless it is a group member
    // that asked to be told apart from an idle one (set_on_close).
    if (server_.options.idle_timeout.count() > 0 && on_close_.empty()) {
      // As the hello tells clients (at most UINT32_MAX ms): a larger one (milliseconds::max())
      // would wrap to a past expiry in the timer's nanoseconds and close every session at once.
      arm(std::min<std::chrono::milliseconds>(server_.options.idle_timeout,
                                              std::chrono::milliseconds(UINT32_MAX)),
          Timer::kIdle);
    } else {
      disarm();
    }
    watch_header();
  }

  // The next header is read during a wait too: a waiting client sends nothing until it is
  // answered, so this read ends only when it closes the connection, and then the session ends
  // at once (its descriptor freed, its on-close keys written) instead of when the wait does.
  // A header that comes before the answer was written waits for it (writes then reads, in order).
  void watch_header() {
    if (header_pending_) return;
    header_pending_ = true;
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_), [self](asio::error_code ec, size_t) {
      self->header_pending_ = false;
      if (self->closed_) return;
      if (ec) return self->close(self->waiting_ ? "peer closed during a wait" : "peer closed");
      if (self->waiting_ || self->writing_) {
        self->header_early_ = true;
        return;
      }
      self->start_body();
    });
  }

  void start_body() {
    uint32_t n;
    std::memcpy(&n, header_.data(), 4);
    if (n == 0 || n > server_.max_message_bytes()) return close("bad message length");
    expected_ = n;
    body_.clear();
    read_body();
  }

  // Reads the body piece by piece, allocating only for bytes that are on their way.
  void read_body() {
    const size_t have = body_.size();
    const size_t want = std::min(expected_ - have, proto::kReadChunkBytes);
    if (!server_.reserve(want)) {
      server_.memory_warning.warn(
          "tcp store: closing a connection: partly received messages would hold more than {} "
          "bytes (max_buffered_bytes)",
          server_.options.max_buffered_bytes);
      return close("memory cap");
    }
    reserved_ += want;
    body_.resize(have + want);
    arm(kStallTimeout, Timer::kStall);
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(&body_[have], want),
                            [self, have, want](asio::error_code ec, size_t got) {
                              if (self->closed_) return;
                              self->body_.resize(have + got);
                              self->reserved_ -= want - got;
                              self->server_.release(want - got);
                              if (ec) return self->close("truncated message");
                              if (self->body_.size() < self->expected_) return self->read_body();
                              self->disarm();
                              self->handle();
                            });
  }

  // Gives the body's memory back (to the allocator when it was large).
  void release_body() {
    server_.release(reserved_);
    reserved_ = 0;
    if (body_.capacity() > proto::kReadChunkBytes) {
      std::string().swap(body_);
    } else {
      body_.clear();
    }
  }

  void respond(const proto::Writer& w) {
    if (closed_) return;
    out_ = w.framed();
    arm(kWriteTimeout, Timer::kWrite);
    writing_ = true;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->close("write failed");
      if (self->out_.capacity() > proto::kReadChunkBytes) std::string().swap(self->out_);
      if (self->header_early_) {
        self->header_early_ = false;
        self->disarm();
        return self->start_body();
      }
      self->read_header();
    });
  }

  void handle() {
    using proto::Command;
    using proto::Status;
    proto::Reader r(body_.data(), body_.size());
    const auto cmd = static_cast<Command>(r.u8());
    auto& data = server_.data;
    proto::Writer w;
    bool mutated = false;
    switch (cmd) {
      case Command::kSet: {
        std::string key = r.str(proto::kMaxKeyBytes);
        std::string value = r.str(proto::kMaxValueBytes);
        if (!r.done()) return close("malformed set");
        data[std::move(key)] = std::move(value);
        w.u8(static_cast<uint8_t>(Status::kOk));
        mutated = true;
        break;
      }
      case Command::kGet: {
        const std::string key = r.str(proto::kMaxKeyBytes);
        if (!r.done()) return close("malformed get");
        auto it = data.find(key);
        if (it == data.end()) {
          w.u8(static_cast<uint8_t>(Status::kNotFound));
        } else {
          w.u8(static_cast<uint8_t>(Status::kOk)).str(it->second);
        }
        break;
      }
      case Command::kAdd: {
        const std::string key = r.str(proto::kMaxKeyBytes);
        const int64_t delta = r.i64();
        if (!r.done()) return close("malformed add");
        auto it = data.find(key);
        int64_t value = 0;
        try {
          value = detail::add_to_counter(key, it == data.end() ? nullptr : &it->second, delta);
        } catch (const Error& e) {
          // The code after the message: clients from before it read the message alone.
          w.u8(static_cast<uint8_t>(Status::kError))
              .str(e.what())
              .u8(static_cast<uint8_t>(e.code()));
          break;
        }
        data[key] = std::to_string(value);
        w.u8(static_cast<uint8_t>(Status::kOk)).i64(value);
        mutated = true;
        break;
      }
      case Command::kCompareSet: {
        const std::string key = r.str(proto::kMaxKeyBytes);
        const std::string expected = r.str(proto::kMaxValueBytes);
        std::string desired = r.str(proto::kMaxValueBytes);
        if (!r.done()) return close("malformed compare_set");
        auto it = data.find(key);
        std::string result;
        if (it == data.end()) {
          if (expected.empty()) {
            result = desired;
            data[key] = std::move(desired);
            mutated = true;
          } else {
            result = expected;
          }
        } else {
          if (it->second == expected) {
            it->second = std::move(desired);
            mutated = true;
          }
          result = it->second;
        }
        w.u8(static_cast<uint8_t>(Status::kOk)).str(result);
        break;
      }
      case Command::kWait: {
        const int64_t timeout_ms = r.i64();
        std::vector<std::string> keys = r.keys();
        if (!r.done() || timeout_ms < 0) return close("malformed wait");
        release_body();
        // Only the keys still missing, each once (as c10d's store counts them): a wait listing a
        // present key many times must not make every later write look it up again.
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        keys.erase(std::remove_if(keys.begin(), keys.end(),
                                  [&](const std::string& k) { return data.count(k) > 0; }),
                   keys.end());
        if (keys.empty()) {
          w.u8(static_cast<uint8_t>(Status::kOk));
          break;
        }
        // What a wait keeps counts against the cap on buffered bytes, as a message does.
        size_t bytes = 0;
        for (const auto& k : keys) bytes += k.size();
        if (!server_.reserve(bytes)) return close("the waits' keys would pass max_buffered_bytes");
        wait_reserved_ = bytes;
        wait_keys_ = std::move(keys);
        server_.waiting.insert(shared_from_this());
        server_.waiting_count.store(server_.waiting.size(), std::memory_order_relaxed);
        arm(std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs)), Timer::kWait);
        waiting_ = true;
        watch_header();
        return;  // answered by wake() or the timer
      }
      case Command::kCheck: {
        const std::vector<std::string> keys = r.keys();
        if (!r.done()) return close("malformed check");
        bool all = true;
        for (const auto& k : keys) all = all && data.count(k) > 0;
        w.u8(static_cast<uint8_t>(Status::kOk)).u8(all ? 1 : 0);
        break;
      }
      case Command::kDelete: {
        const std::string key = r.str(proto::kMaxKeyBytes);
        if (!r.done()) return close("malformed delete");
        w.u8(static_cast<uint8_t>(Status::kOk)).u8(data.erase(key) > 0 ? 1 : 0);
        break;
      }
      case Command::kNumKeys:
        if (!r.done()) return close("malformed num_keys");
        w.u8(static_cast<uint8_t>(Status::kOk)).i64(static_cast<int64_t>(data.size()));
        break;
      case Command::kPing:
        if (!r.done()) return close("malformed ping");
        w.u8(static_cast<uint8_t>(Status::kOk));
        break;
      case Command::kSetOnClose: {
        std::string key = r.str(proto::kMaxKeyBytes);
        std::string value = r.str(proto::kMaxValueBytes);
        if (!r.done()) return close("malformed set_on_close");
        if (on_close_.size() >= proto::kMaxOnCloseKeys) {
          w.u8(static_cast<uint8_t>(Status::kError))
              .str("a connection may register at most " + std::to_string(proto::kMaxOnCloseKeys) +
                   " keys with set_on_close");
          break;
        }
        on_close_.emplace_back(std::move(key), std::move(value));
        w.u8(static_cast<uint8_t>(Status::kOk));
        break;
      }
      default: return close("unknown command");
    }
    release_body();
    respond(w);
    if (mutated) server_.notify_waiters();
  }

  TCPStoreServer::Impl& server_;
  detail::StoreStream socket_;
  asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  bool closed_ = false;
  bool waiting_ = false;         // in a wait, answered by wake() or the wait's timer
  bool writing_ = false;         // a response is being written
  bool header_pending_ = false;  // a read of the next header is under way
  bool header_early_ = false;    // a header came during a wait or a write: read on after it
  std::string nonce_;
  std::string hello_;
  std::array<char, 4> header_{};
  size_t expected_ = 0;  // the body length the header announced
  std::string body_;
  size_t reserved_ = 0;  // bytes of body_ counted against the server's cap
  std::string out_;
  std::vector<std::string> wait_keys_;  // the keys a wait still misses
  size_t wait_reserved_ = 0;            // their bytes, counted against the server's cap
  std::vector<std::pair<std::string, std::string>> on_close_;
};

void TCPStoreServer::Impl::accept() {
  acceptor.async_accept([this](asio::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of file descriptors (or memory): retrying at once would spin, as the pending
      // connection stays queued. Pause, doubling, until accepting works again.
      accept_errors.fetch_add(1, std::memory_order_relaxed);
      accept_pause = accept_pause == Clock::duration::zero()
                         ? Clock::duration(kFirstAcceptPause)
                         : std::min<Clock::duration>(accept_pause * 2, kMaxAcceptPause);
      accept_warning.warn(
          "tcp store: accept failed: {}; pausing accepts for {} ms ({} open "
          "connections)",
          ec.message(), std::chrono::duration_cast<std::chrono::milliseconds>(accept_pause).count(),
          sessions.size());
      accept_timer.expires_after(accept_pause);
      accept_timer.async_wait([this](asio::error_code timer_ec) {
        if (!timer_ec) accept();
      });
      return;
    }
    accept_pause = Clock::duration::zero();
    // Not inherited by programs this process starts (asio opens sockets without close-on-exec;
    // tutti-run's ranks held the store's port after it was gone).
    ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
    // Keepalive: a client's host cut off while the session is idle (a client waiting for a key)
    // closes it within the link's bound, and its departure key then says "closed", which shrink
    // reads. One cut while a reply is unacknowledged waits for the kernel's retransmissions.
    detail::watch_link(socket.native_handle());
    if (sessions.size() >= options.max_connections) {
      refused_connections.fetch_add(1, std::memory_order_relaxed);
      cap_warning.warn("tcp store: refusing a connection: {} connections open (max_connections)",
                       sessions.size());
      asio::error_code ignored;
      socket.close(ignored);
    } else {
      asio::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(*this, std::move(socket));
      sessions.insert(session);
      connections.store(sessions.size(), std::memory_order_relaxed);
      session->start();
    }
    accept();
  });
}

void TCPStoreServer::Impl::session_ended(const std::shared_ptr<Session>& session) {
  waiting.erase(session);
  waiting_count.store(waiting.size(), std::memory_order_relaxed);
  sessions.erase(session);
  connections.store(sessions.size(), std::memory_order_relaxed);
  if (session->on_close().empty()) return;
  for (auto& [key, value] : session->on_close()) data[key] = std::move(value);
  session->on_close().clear();
  notify_waiters();
}

void TCPStoreServer::Impl::notify_waiters() {
  std::vector<std::shared_ptr<Session>> ready;
  for (const auto& s : waiting) {
    bool all = true;
    for (const auto& k : s->wait_keys()) all = all && data.count(k) > 0;
    if (all) ready.push_back(s);
  }
  for (const auto& s : ready) waiting.erase(s);
  waiting_count.store(waiting.size(), std::memory_order_relaxed);
  for (const auto& s : ready) s->wake();
}

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, const std::string& secret)
    : TCPStoreServer(host, port, [&] {
        TCPStoreServerOptions options;
        options.secret = secret;
        return options;
      }()) {}

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port,
                               TCPStoreServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->options = std::move(options);
  if (impl_->options.tls) {
    impl_->tls = detail::asio_context(
        detail::make_psk_context(/*server=*/true, impl_->options.secret, kTlsLabel));
  }
  impl_->id = detail::random_bytes(proto::kServerIdBytes);
  impl_->nonce = hex(impl_->id);
  impl_->data["tutti/store-nonce"] = impl_->nonce;
  const std::string where = "tcp store server " + host + ":" + std::to_string(port);
  asio::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    throw Error(ErrorCode::kIoError, where + ": cannot resolve host: " + ec.message());
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) ::fcntl(impl_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);  // as accept()'s
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  // With SO_REUSEADDR two sockets may both bind a port that neither listens on yet; the loser of
  // that race learns it at listen().
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec == asio::error::address_in_use) {
    throw Error(ErrorCode::kUnavailable, where + ": address already in use");
  }
  if (ec) throw Error(ErrorCode::kIoError, where + ": " + ec.message());
  impl_->port = impl_->acceptor.local_endpoint().port();
  if (endpoint.address().is_unspecified() && impl_->options.secret.empty()) {
    TUTTI_LOG_WARN(
        "tcp store server listens on every interface ({}:{}) without a secret; set "
        "TUTTI_STORE_SECRET or ?secret= to keep other hosts' clients out",
        host, impl_->port);
  }
  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] {
    try {
      impl->io.run();
    } catch (const std::exception& e) {
      TUTTI_LOG_ERROR("tcp store server stopped: {}", e.what());
    }
  });
  TUTTI_LOG_DEBUG("tcp store server listening on {}:{}", host, impl_->port);
}

TCPStoreServer::~TCPStoreServer() {
  if (::getpid() != impl_->owner_pid) {
    // A forked child: the server's thread exists only in the parent, so it can be neither
    // stopped nor joined here (a join would wait forever). Leave it all be.
    static_cast<void>(impl_.release());
    return;
  }
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The loop has stopped: release the sessions here (their sockets close with them) before the
  // io_context goes, without running their close() bookkeeping.
  impl_->waiting.clear();
  auto sessions = std::move(impl_->sessions);
  sessions.clear();
}

uint16_t TCPStoreServer::port() const {
  return impl_->port;
}
const std::string& TCPStoreServer::host() const {
  return impl_->host;
}
const std::string& TCPStoreServer::nonce() const {
  return impl_->nonce;
}

TCPStoreServer::Stats TCPStoreServer::stats() const {
  Stats s;
  s.connections = impl_->connections.load(std::memory_order_relaxed);
  s.waiting = impl_->waiting_count.load(std::memory_order_relaxed);
  s.buffered_bytes = impl_->buffered_bytes.load(std::memory_order_relaxed);
  s.accept_errors = impl_->accept_errors.load(std::memory_order_relaxed);
  s.refused_connections = impl_->refused_connections.load(std::memory_order_relaxed);
  s.idle_closed = impl_->idle_closed.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tutti
