#include <asio.hpp>

#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "logging.h"
#include "sha256.h"
#include "store_util.h"
#include "tcp_store_protocol.h"
#include "tutti/error.h"
#include "tutti/tcp_store.h"

namespace tutti {

using asio::ip::tcp;
namespace proto = detail::tcp_store;

namespace {
// A client must finish its handshake, and the rest of a message it has begun, within this.
constexpr auto kStallTimeout = std::chrono::seconds(10);
// A response that the client does not read within this closes the connection.
constexpr auto kWriteTimeout = std::chrono::seconds(30);
// A wait may last at most this long, whatever the client asks.
constexpr int64_t kMaxWaitMs = int64_t(24) * 3600 * 1000;

std::string random_bytes(size_t n) {
  std::random_device rd;
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rd() & 0xff);
  return out;
}

std::string hex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}
}  // namespace

class Session;

struct TCPStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::string host;
  std::string secret;
  std::string nonce;
  uint16_t port = 0;
  std::unordered_map<std::string, std::string> data;
  std::set<std::shared_ptr<Session>> sessions;
  std::set<std::shared_ptr<Session>> waiting;  // sessions blocked in a wait

  void accept();
  void notify_waiters();
};

// One client connection. Lives on the server's single I/O thread: no locks.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TCPStoreServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server.io) {}

  void start() {
    nonce_ = random_bytes(proto::kNonceBytes);
    proto::Writer hello;
    hello.u32(proto::kMagic).u16(proto::kVersion).raw(nonce_.data(), nonce_.size());
    out_ = hello.body();
    arm(kStallTimeout);
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
      if (ec) return self->close("handshake write failed");
      self->body_.resize(proto::kClientHelloBytes);
      asio::async_read(socket_of(self), asio::buffer(self->body_),
                       [self](asio::error_code ec2, size_t) {
                         if (ec2) return self->close("handshake read failed");
                         self->finish_handshake();
                       });
    });
  }

  const std::vector<std::string>& wait_keys() const { return wait_keys_; }

  // Called by the server when the keys this session waits for exist.
  void wake() {
    ++timer_generation_;
    timer_.cancel();
    respond(proto::Writer().u8(static_cast<uint8_t>(proto::Status::kOk)));
  }

  void close(const char* why) {
    if (closed_) return;
    closed_ = true;
    TUTTI_LOG_DEBUG("tcp store: closing connection: {}", why);
    asio::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
    auto self = shared_from_this();
    server_.waiting.erase(self);
    server_.sessions.erase(self);
  }

 private:
  static tcp::socket& socket_of(const std::shared_ptr<Session>& s) { return s->socket_; }

  // One timer serves the handshake, a partly received message, a wait and a write, which never
  // overlap; the generation counter makes a stale expiry harmless.
  void arm(std::chrono::steady_clock::duration after, bool is_wait = false) {
    const uint64_t generation = ++timer_generation_;
    timer_.expires_after(after);
    auto self = shared_from_this();
    timer_.async_wait([self, generation, is_wait](asio::error_code ec) {
      if (ec || generation != self->timer_generation_ || self->closed_) return;
      if (is_wait) {
        self->server_.waiting.erase(self);
        self->respond(proto::Writer().u8(static_cast<uint8_t>(proto::Status::kTimeout)));
      } else {
        self->close("stalled");
      }
    });
  }

  void disarm() {
    ++timer_generation_;
    timer_.cancel();
  }

  void finish_handshake() {
    proto::Reader r(body_.data(), body_.size());
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    std::string proof(proto::kProofBytes, '\0');
    for (auto& c : proof) c = static_cast<char>(r.u8());
    bool ok = r.done() && magic == proto::kMagic && version == proto::kVersion;
    if (ok && !server_.secret.empty()) {
      const auto want = detail::hmac_sha256(server_.secret, nonce_);
      unsigned diff = 0;  // constant time
      for (size_t i = 0; i < want.size(); ++i) diff |= want[i] ^ static_cast<uint8_t>(proof[i]);
      ok = diff == 0;
    }
    if (!ok) {
      TUTTI_LOG_WARN("tcp store: refused a client (bad magic, version or secret)");
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
      self->disarm();
      self->read_header();
    });
  }

  void read_header() {
    auto self = shared_from_this();
    // Idle between messages is fine: no timer here.
    asio::async_read(socket_, asio::buffer(header_), [self](asio::error_code ec, size_t) {
      if (ec) return self->close("peer closed");
      uint32_t n;
      std::memcpy(&n, self->header_.data(), 4);
      if (n == 0 || n > proto::kMaxBodyBytes) return self->close("bad message length");
      self->body_.resize(n);
      self->arm(kStallTimeout);
      asio::async_read(socket_of(self), asio::buffer(self->body_),
                       [self](asio::error_code ec2, size_t) {
                         if (ec2) return self->close("truncated message");
                         self->disarm();
                         self->handle();
                       });
    });
  }

  void respond(const proto::Writer& w) {
    if (closed_) return;
    out_ = w.framed();
    arm(kWriteTimeout);
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self](asio::error_code ec, size_t) {
      if (ec) return self->close("write failed");
      self->disarm();
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
        int64_t value = delta;
        try {
          if (it != data.end()) value += detail::parse_counter(key, it->second);
        } catch (const Error& e) {
          w.u8(static_cast<uint8_t>(Status::kError)).str(e.what());
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
        bool all = true;
        for (const auto& k : keys) all = all && data.count(k) > 0;
        if (all) {
          w.u8(static_cast<uint8_t>(Status::kOk));
          break;
        }
        wait_keys_ = std::move(keys);
        server_.waiting.insert(shared_from_this());
        arm(std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs)), /*is_wait=*/true);
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
      default:
        return close("unknown command");
    }
    respond(w);
    if (mutated) server_.notify_waiters();
  }

  TCPStoreServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  bool closed_ = false;
  std::string nonce_;
  std::array<char, 4> header_{};
  std::string body_;
  std::string out_;
  std::vector<std::string> wait_keys_;
};

void TCPStoreServer::Impl::accept() {
  acceptor.async_accept([this](asio::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      TUTTI_LOG_WARN("tcp store: accept failed: {}", ec.message());
    } else {
      asio::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(*this, std::move(socket));
      sessions.insert(session);
      session->start();
    }
    accept();
  });
}

void TCPStoreServer::Impl::notify_waiters() {
  std::vector<std::shared_ptr<Session>> ready;
  for (const auto& s : waiting) {
    bool all = true;
    for (const auto& k : s->wait_keys()) all = all && data.count(k) > 0;
    if (all) ready.push_back(s);
  }
  for (const auto& s : ready) {
    waiting.erase(s);
    s->wake();
  }
}

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, const std::string& secret)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->secret = secret;
  impl_->nonce = hex(random_bytes(8));
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
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    throw Error(ErrorCode::kUnavailable, where + ": address already in use");
  }
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error(ErrorCode::kIoError, where + ": " + ec.message());
  impl_->port = impl_->acceptor.local_endpoint().port();
  if (endpoint.address().is_unspecified() && secret.empty()) {
    TUTTI_LOG_WARN("tcp store server listens on every interface ({}:{}) without a secret; set "
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
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The loop has stopped: release the sessions here (their sockets close with them) before the
  // io_context goes, without running their close() bookkeeping.
  impl_->waiting.clear();
  auto sessions = std::move(impl_->sessions);
  sessions.clear();
}

uint16_t TCPStoreServer::port() const { return impl_->port; }
const std::string& TCPStoreServer::host() const { return impl_->host; }
const std::string& TCPStoreServer::nonce() const { return impl_->nonce; }

}  // namespace tutti
