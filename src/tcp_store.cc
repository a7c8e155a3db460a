#include "tutti/tcp_store.h"

#include <asio.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "logging.h"
#include "sha256.h"
#include "store_util.h"
#include "tcp_store_protocol.h"
#include "tutti/error.h"

namespace tutti {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
namespace proto = detail::tcp_store;

namespace {

// Servers hosted by this process, by "host:port", shared by every TCPStore that hosts the same
// address (several groups given one store URL): the server lives while any of them does.
std::mutex hosted_mutex;
std::map<std::string, std::weak_ptr<TCPStoreServer>>& hosted() {
  static auto* servers = new std::map<std::string, std::weak_ptr<TCPStoreServer>>();
  return *servers;
}

std::shared_ptr<TCPStoreServer> host_server(const std::string& host, uint16_t port,
                                            const std::string& secret) {
  std::lock_guard<std::mutex> lock(hosted_mutex);
  const std::string key = host + ":" + std::to_string(port);
  if (port != 0) {
    if (auto existing = hosted()[key].lock()) return existing;
  }
  auto server = std::make_shared<TCPStoreServer>(host, port, secret);
  hosted()[host + ":" + std::to_string(server->port())] = server;
  return server;
}

// Extra time a client allows the server to answer a wait past the wait's own timeout.
constexpr auto kWaitGrace = std::chrono::seconds(5);

}  // namespace

struct TCPStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::string secret;
  std::shared_ptr<TCPStoreServer> server;  // when hosting
  std::mutex mutex;                        // one request at a time on the connection
  asio::io_context io;
  std::optional<tcp::socket> socket;

  std::string where() const { return "TCPStore " + host + ":" + std::to_string(port); }

  // Runs the queued asynchronous operations until they finish or the deadline passes; on the
  // deadline the connection is dropped (its state is unknown) and false returned.
  bool run_until(Clock::time_point deadline) {
    io.restart();
    io.run_until(deadline);
    if (io.stopped()) return true;
    drop();
    return false;
  }

  void drop() {
    if (socket) {
      asio::error_code ec;
      socket->close(ec);
    }
    io.restart();
    io.run();  // lets the cancelled handlers finish
    socket.reset();
  }

  // Connects and authenticates, retrying with back-off until the deadline: the host may not be
  // up yet.
  void connect(Clock::time_point deadline) {
    auto pause = std::chrono::milliseconds(10);
    std::string last_error = "no attempt";
    while (true) {
      if (try_connect(deadline, last_error)) return;
      const auto now = Clock::now();
      if (now >= deadline) {
        throw Error(ErrorCode::kTimeout,
                    where() + ": could not connect before the timeout (" + last_error + ")");
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }

  bool try_connect(Clock::time_point deadline, std::string& error) {
    asio::error_code ec;
    tcp::resolver resolver(io);
    auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) {
      error = "resolve: " + ec.message();
      return false;
    }
    socket.emplace(io);
    asio::error_code result = asio::error::would_block;
    asio::async_connect(*socket, endpoints,
                        [&](asio::error_code e, const tcp::endpoint&) { result = e; });
    if (!run_until(deadline)) {
      error = "connect timed out";
      return false;
    }
    if (result) {
      error = "connect: " + result.message();
      socket.reset();
      return false;
    }
    socket->set_option(tcp::no_delay(true), ec);
    // Handshake: the server's nonce, then our proof of the secret.
    std::string hello(proto::kServerHelloBytes, '\0');
    if (!transfer_read(hello, deadline, error)) return false;
    proto::Reader r(hello.data(), hello.size());
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    if (magic != proto::kMagic || version != proto::kVersion) {
      drop();
      throw Error(ErrorCode::kIoError,
                  where() + ": the server speaks another protocol (magic " +
                      std::to_string(magic) + ", version " + std::to_string(version) + ")");
    }
    const std::string nonce = hello.substr(6);
    proto::Writer w;
    w.u32(proto::kMagic).u16(proto::kVersion);
    if (secret.empty()) {
      w.raw(std::string(proto::kProofBytes, '\0').data(), proto::kProofBytes);
    } else {
      const auto proof = detail::hmac_sha256(secret, nonce);
      w.raw(proof.data(), proof.size());
    }
    if (!transfer_write(w.body(), deadline, error)) return false;
    std::string status(1, '\0');
    if (!transfer_read(status, deadline, error)) return false;
    if (static_cast<proto::Status>(status[0]) != proto::Status::kOk) {
      drop();
      throw Error(ErrorCode::kRemoteError,
                  where() + ": the server refused this client (wrong or missing secret)");
    }
    return true;
  }

  // Runs one asynchronous transfer, started by start(handler), to completion before the
  // deadline; on failure drops the connection and says why in `error`.
  template <typename Start>
  bool transfer(const char* what, Start&& start, Clock::time_point deadline, std::string& error) {
    asio::error_code result = asio::error::would_block;
    start([&](asio::error_code e, size_t) { result = e; });
    if (!run_until(deadline)) {
      error = std::string(what) + " timed out";
      return false;
    }
    if (result) {
      error = std::string(what) + ": " + result.message();
      drop();
      return false;
    }
    return true;
  }
  bool transfer_write(const std::string& bytes, Clock::time_point deadline, std::string& error) {
    return transfer(
        "write", [&](auto done) { asio::async_write(*socket, asio::buffer(bytes), done); },
        deadline, error);
  }
  bool transfer_read(std::string& bytes, Clock::time_point deadline, std::string& error) {
    return transfer(
        "read", [&](auto done) { asio::async_read(*socket, asio::buffer(bytes), done); },
        deadline, error);
  }

  // Sends one request and returns the response body (status first). `op` names the request in
  // errors.
  std::string request(const proto::Writer& w, Clock::time_point deadline, const std::string& op) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!socket) connect(deadline);
    std::string error;
    std::string header(4, '\0');
    if (!transfer_write(w.framed(), deadline, error) || !transfer_read(header, deadline, error)) {
      throw failure(op, error);
    }
    uint32_t n;
    std::memcpy(&n, header.data(), 4);
    if (n == 0 || n > proto::kMaxBodyBytes) {
      drop();
      throw Error(ErrorCode::kIoError, where() + ": " + op + ": bad response length " +
                                           std::to_string(n));
    }
    std::string body(n, '\0');
    if (!transfer_read(body, deadline, error)) throw failure(op, error);
    return body;
  }

  Error failure(const std::string& op, const std::string& error) const {
    const bool timed_out = error.find("timed out") != std::string::npos;
    return Error(timed_out ? ErrorCode::kTimeout : ErrorCode::kIoError,
                 where() + ": " + op + " failed: " + error);
  }
};

TCPStore::TCPStore(std::string host, uint16_t port, TCPStoreOptions options)
    : Store(options.timeout), impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  impl_->secret = options.secret;
  if (options.host) {
    try {
      impl_->server = host_server(impl_->host, port, options.secret);
      impl_->port = impl_->server->port();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnavailable || port == 0) throw;
      // Another process (a launcher, tutti-store, an earlier rank 0) serves this address.
      TUTTI_LOG_DEBUG("{}: address in use; connecting as a client", impl_->where());
    }
  }
}

TCPStore::~TCPStore() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->socket) impl_->drop();
}

const std::string& TCPStore::host() const { return impl_->host; }
uint16_t TCPStore::port() const { return impl_->port; }
bool TCPStore::is_hosting() const { return impl_->server != nullptr; }

namespace {
proto::Status status_of(const std::string& body) { return static_cast<proto::Status>(body[0]); }
}  // namespace

void TCPStore::set(const std::string& key, const std::string& value) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kSet)).str(key).str(value);
  impl_->request(w, Clock::now() + timeout(), "set '" + key + "'");
}

std::string TCPStore::get(const std::string& key) {
  wait({key}, timeout());
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kGet)).str(key);
  const std::string body = impl_->request(w, Clock::now() + timeout(), "get '" + key + "'");
  if (status_of(body) != proto::Status::kOk) {
    throw detail::store_timeout("TCPStore", timeout(), {key});  // deleted after the wait
  }
  proto::Reader r(body.data() + 1, body.size() - 1);
  std::string value = r.str(proto::kMaxValueBytes);
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed get response");
  return value;
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kAdd)).str(key).i64(delta);
  const std::string body = impl_->request(w, Clock::now() + timeout(), "add '" + key + "'");
  proto::Reader r(body.data() + 1, body.size() - 1);
  if (status_of(body) == proto::Status::kError) {
    throw Error(ErrorCode::kInvalidUsage, r.str(proto::kMaxValueBytes));
  }
  const int64_t value = r.i64();
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed add response");
  return value;
}

std::string TCPStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kCompareSet)).str(key).str(expected).str(desired);
  const std::string body =
      impl_->request(w, Clock::now() + timeout(), "compare_set '" + key + "'");
  proto::Reader r(body.data() + 1, body.size() - 1);
  std::string value = r.str(proto::kMaxValueBytes);
  if (!r.done()) {
    throw Error(ErrorCode::kIoError, impl_->where() + ": malformed compare_set response");
  }
  return value;
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kWait)).i64(timeout.count());
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string body = impl_->request(w, Clock::now() + timeout + kWaitGrace, "wait");
  if (status_of(body) == proto::Status::kOk) return;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!check({k})) missing.push_back(k);
  }
  throw detail::store_timeout("TCPStore", timeout, missing);
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kCheck)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string body = impl_->request(w, Clock::now() + timeout(), "check");
  return body.size() == 2 && body[1] == 1;
}

bool TCPStore::delete_key(const std::string& key) {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kDelete)).str(key);
  const std::string body = impl_->request(w, Clock::now() + timeout(), "delete '" + key + "'");
  return body.size() == 2 && body[1] == 1;
}

int64_t TCPStore::num_keys() {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kNumKeys));
  const std::string body = impl_->request(w, Clock::now() + timeout(), "num_keys");
  proto::Reader r(body.data() + 1, body.size() - 1);
  const int64_t n = r.i64();
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed num_keys response");
  return n;
}

}  // namespace tutti
