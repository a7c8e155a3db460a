#include "tutti/tcp_store.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <asio.hpp>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "store/store_stream.h"
#include "store/store_util.h"
#include "store/tcp_store_protocol.h"
#include "tutti/error.h"
#include "util/crypto.h"
#include "util/deadline.h"
#include "util/logging.h"
#include "util/tcp_link.h"
#include "util/tls.h"

namespace tutti {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
namespace proto = detail::tcp_store;
using detail::deadline_after;

namespace {

// Servers hosted by this process, by "host:port", shared by every TCPStore that hosts the same
// address (several groups given one store URL). One hosted on an explicit port is also kept
// until the process exits: a group destroyed and created again finds it still there, and so do
// the other ranks that came back to it first. One hosted on port 0 goes with its last TCPStore
// (nobody could ask for it by address before it was made, and each would leak a thread).
struct Hosted {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<TCPStoreServer>> by_address;
  std::vector<std::shared_ptr<TCPStoreServer>> kept;
};

Hosted& hosted() {
  static auto* instance = new Hosted();  // leaked: used at exit
  return *instance;
}

std::shared_ptr<TCPStoreServer> host_server(const std::string& host, uint16_t port,
                                            const TCPStoreServerOptions& options) {
  auto& h = hosted();
  std::lock_guard<std::mutex> lock(h.mutex);
  const std::string key = host + ":" + std::to_string(port);
  if (port != 0) {
    if (auto existing = h.by_address[key].lock()) {
      if (std::find(h.kept.begin(), h.kept.end(), existing) == h.kept.end()) {
        h.kept.push_back(existing);
      }
      return existing;
    }
  }
  auto server = std::make_shared<TCPStoreServer>(host, port, options);
  h.by_address[host + ":" + std::to_string(server->port())] = server;
  if (port != 0) h.kept.push_back(server);
  return server;
}

// Stops the kept servers at exit (a server still used by a live TCPStore stops when that store
// goes). Installed when the library is loaded, so it runs after exit hooks installed later (the
// groups', which still use the store while they leave it), and before the static objects that
// were built before it.
void stop_kept_servers() {
  std::vector<std::shared_ptr<TCPStoreServer>> kept;
  {
    std::lock_guard<std::mutex> lock(hosted().mutex);
    kept.swap(hosted().kept);
  }
  kept.clear();
}

[[maybe_unused]] const bool kStopKeptServersAtExit = [] {
  // Built first, so they are destroyed after the servers stopped (their threads use them).
  static_cast<void>(hosted());
  static_cast<void>(asio::error::get_system_category());
  static_cast<void>(asio::error::get_netdb_category());
  static_cast<void>(asio::error::get_addrinfo_category());
  static_cast<void>(asio::error::get_misc_category());
  static_cast<void>(asio::error::get_ssl_category());
  static_cast<void>(asio::ssl::error::get_stream_category());
  // OpenSSL has no exit-time teardown to order against (util/crypto.cc initialises it so).
  std::atexit(stop_kept_servers);
  return true;
}();

// Extra time a client allows the server to answer a wait past the wait's own timeout.
constexpr auto kWaitGrace = std::chrono::seconds(5);
// A would-be host that found its address taken gives the listener there this long to greet it
// as a tutti store does at once; silence means another program holds the port.
constexpr auto kForeignListenerGrace = std::chrono::seconds(5);
// The longest wait asked of the server at once (its own cap is 24 h); longer waits ask again.
constexpr int64_t kWaitSliceMs = int64_t(12) * 3600 * 1000;

// Whether a request may be sent again when the connection broke after it was sent (so it may
// have been applied): kSafe for requests whose repetition changes nothing.
enum class Repeat { kSafe, kOnlyIfUnapplied };

std::string printable(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex, text;
  for (unsigned char c : bytes) {
    if (!hex.empty()) hex.push_back(' ');
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
    text.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '.');
  }
  return hex + " '" + text + "'";
}

// The protocol's limits, checked before anything is sent: the server would close the connection
// on a request past them, and a client that resent it would only be cut off again.
void check_key(const std::string& where, const std::string& key) {
  if (key.size() > proto::kMaxKeyBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                where + ": key of " + std::to_string(key.size()) + " bytes; at most " +
                    std::to_string(proto::kMaxKeyBytes) + " are allowed");
  }
}
void check_value(const std::string& where, const std::string& key, const std::string& value) {
  if (value.size() > proto::kMaxValueBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                where + ": value of " + std::to_string(value.size()) + " bytes for key '" + key +
                    "'; at most " + std::to_string(proto::kMaxValueBytes) + " are allowed");
  }
}
void check_keys(const std::string& where, const std::vector<std::string>& keys) {
  if (keys.size() > proto::kMaxKeysPerRequest) {
    throw Error(ErrorCode::kInvalidArgument,
                where + ": " + std::to_string(keys.size()) + " keys in one request; at most " +
                    std::to_string(proto::kMaxKeysPerRequest) + " are allowed");
  }
  for (const auto& key : keys) check_key(where, key);
}

}  // namespace

// One request at a time on a client's connection: the turn is taken by a deadline, and who has
// it is known to those waiting. (A std::timed_mutex would do, but ThreadSanitizer does not see
// the pthread_mutex_clocklock under its try_lock_until: a mutex, a flag and a condition.)
class Turn {
 public:
  // False at the deadline; `holder` then says whose turn it was.
  bool take(Clock::time_point deadline, const std::string& who, std::string& holder) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!free_.wait_until(lock, deadline, [&] { return !taken_; })) {
      holder = who_;
      return false;
    }
    taken_ = true;
    who_ = who;
    return true;
  }
  void give_back() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      taken_ = false;
      who_.clear();
    }
    free_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  bool taken_ = false;
  std::string who_;
};

// Holds a turn until it goes: one taken already (by a deadline), or taken here, waiting as long
// as the request before it takes.
class TurnHeld {
 public:
  TurnHeld(Turn& t, std::adopt_lock_t) : t_(t) {}
  TurnHeld(Turn& t, const std::string& who) : t_(t) {
    std::string holder;
    t_.take(Clock::time_point::max(), who, holder);
  }
  ~TurnHeld() { t_.give_back(); }
  TurnHeld(const TurnHeld&) = delete;
  TurnHeld& operator=(const TurnHeld&) = delete;

 private:
  Turn& t_;
};

struct TCPStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::string secret;
  std::shared_ptr<TCPStoreServer> server;  // when hosting
  std::string hosting_error;               // why hosting failed (the address was in use)
  Turn turn;                               // one request at a time on the connection
  asio::io_context io;
  std::unique_ptr<asio::ssl::context> tls;  // with TCPStoreOptions::tls
  std::optional<detail::StoreStream> socket;
  // What the server said in its hello; kept across reconnections to tell a restarted server.
  std::string server_id;
  std::chrono::milliseconds server_idle_timeout{0};
  size_t server_max_message = proto::kMaxBodyBytes;
  Clock::time_point last_used;
  std::vector<std::pair<std::string, std::string>> on_close;  // set_on_close registrations

  std::string where() const { return "TCPStore " + host + ":" + std::to_string(port); }

  // Said in every connection failure of a store that was asked to host but could not.
  std::string hosting_note() const {
    return hosting_error.empty() ? std::string()
                                 : "; this process was to host the store but could not (" +
                                       hosting_error + "): another program may hold the port";
  }

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
      socket->socket().close(ec);
    }
    io.restart();
    io.run();  // lets the cancelled handlers finish
    socket.reset();
  }

  // Whether the open connection can carry a request: the server has not closed it (a FIN or
  // stray bytes are waiting), and it has not been idle so long that the server is about to.
  bool usable() {
    if (server_idle_timeout.count() > 0 && on_close.empty() &&
        Clock::now() - last_used >= server_idle_timeout * 3 / 4) {
      return false;
    }
    char byte;
    const ssize_t n = ::recv(socket->socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  // Connects, authenticates and registers the set_on_close keys, retrying with back-off until
  // the deadline (the host may not be up yet). False at the deadline, with the last failure in
  // `error`; throws when retrying cannot help (not a tutti store, a wrong secret).
  bool connect(Clock::time_point deadline, std::string& error) {
    auto pause = std::chrono::milliseconds(10);
    while (true) {
      if (try_connect(deadline, error)) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
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
    socket.emplace(io, tls.get());
    asio::error_code result = asio::error::would_block;
    asio::async_connect(socket->socket(), endpoints,
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
    socket->socket().set_option(tcp::no_delay(true), ec);
    // Not inherited by programs this process starts (asio opens it without close-on-exec).
    ::fcntl(socket->socket().native_handle(), F_SETFD, FD_CLOEXEC);
    // Keepalive: the store's host cut off fails an idle connection (a wait) within the bound.
    detail::watch_link(socket->socket().native_handle());
    if (socket->tls() && !tls_handshake(deadline, error)) return false;
    // The server greets at once. A would-be host that lost its address to another program gives
    // the listener only a little while to do so.
    const bool foreign_suspect = !hosting_error.empty();
    const auto hello_deadline =
        foreign_suspect ? std::min(deadline, deadline_after(kForeignListenerGrace)) : deadline;
    std::string prefix(proto::kHelloPrefixBytes, '\0');
    if (!transfer_read(prefix, hello_deadline, error)) {
      if (foreign_suspect && Clock::now() < deadline &&
          error.find("timed out") != std::string::npos) {
        const std::string grace = std::to_string(kForeignListenerGrace.count());
        throw Error(ErrorCode::kUnavailable,
                    where() +
                        ": the program listening there does not answer as a tutti store "
                        "(no handshake within " +
                        grace + " s)" + hosting_note());
      }
      error = "handshake: " + error;
      if (!socket && error.find("End of file") != std::string::npos && !tls) {
        error += " (a store with TLS on talks to TLS clients only: TUTTI_STORE_TLS=1)";
      }
      return false;
    }
    proto::Reader r(prefix.data(), prefix.size());
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    if (magic != proto::kMagic) {
      drop();
      throw Error(foreign_suspect ? ErrorCode::kUnavailable : ErrorCode::kIoError,
                  where() + ": the program listening there is not a tutti store (it sent " +
                      printable(prefix) + ")" + hosting_note());
    }
    if (version != proto::kVersion) {
      drop();
      throw Error(ErrorCode::kIoError,
                  where() + ": the store server speaks protocol version " +
                      std::to_string(version) + ", this client version " +
                      std::to_string(proto::kVersion) +
                      ": use tutti-store and libtutti from the same tutti release");
    }
    std::string rest(proto::kServerHelloBytes - proto::kHelloPrefixBytes, '\0');
    if (!transfer_read(rest, deadline, error)) {
      error = "handshake: " + error;
      return false;
    }
    proto::Reader hello(rest.data(), rest.size());
    std::string id(proto::kServerIdBytes, '\0');
    for (auto& c : id) c = static_cast<char>(hello.u8());
    const uint32_t idle_ms = hello.u32();
    const uint32_t max_message = hello.u32();
    std::string nonce(proto::kNonceBytes, '\0');
    for (auto& c : nonce) c = static_cast<char>(hello.u8());
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
    if (!transfer_read(status, deadline, error)) {
      error = "handshake: " + error;
      return false;
    }
    if (static_cast<proto::Status>(status[0]) != proto::Status::kOk) {
      drop();
      throw Error(ErrorCode::kInvalidArgument,
                  where() +
                      ": the server refused this client: wrong or missing secret (give "
                      "the server's secret with ?secret= or TUTTI_STORE_SECRET)");
    }
    if (!server_id.empty() && id != server_id) {
      TUTTI_LOG_WARN(
          "{}: reached a new server instance; the keys set on the previous one are "
          "gone",
          where());
    }
    server_id = id;
    server_idle_timeout = std::chrono::milliseconds(idle_ms);
    server_max_message = max_message;
    last_used = Clock::now();
    // Registrations live with their connection: make them again on this one.
    for (const auto& [key, value] : on_close) {
      proto::Writer reg;
      reg.u8(static_cast<uint8_t>(proto::Command::kSetOnClose)).str(key).str(value);
      std::string body;
      if (!exchange(reg.framed(), deadline, body, error)) return false;
    }
    return true;
  }

  // The TLS handshake on a new connection. A refusal (TLS's own error: the server does not
  // speak TLS, or its secret differs) is thrown, as retrying cannot help; a broken connection
  // is retried by the caller.
  bool tls_handshake(Clock::time_point deadline, std::string& error) {
    asio::error_code result = asio::error::would_block;
    socket->async_handshake(/*server=*/false, [&](asio::error_code e) { result = e; });
    if (!run_until(deadline)) {
      error = "TLS handshake timed out";
      return false;
    }
    if (!result) {
      if (detail::used_the_key(socket->tls_handle())) return true;
      drop();
      throw Error(ErrorCode::kInvalidArgument,
                  where() + ": the TLS handshake was not made with the shared key");
    }
    const bool refused = result.category() == asio::error::get_ssl_category();
    const std::string why = result.message();
    drop();
    if (refused) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + ": the TLS handshake failed (" + why +
                      "): the server may not use TLS (TUTTI_STORE_TLS=1 on both sides), or its "
                      "secret differs");
    }
    error = "TLS handshake: " + why;
    return false;
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
        "read", [&](auto done) { asio::async_read(*socket, asio::buffer(bytes), done); }, deadline,
        error);
  }

  // Writes one framed request and reads its response body (status first). The body is allocated
  // as it arrives, never from its length field alone.
  bool exchange(const std::string& framed, Clock::time_point deadline, std::string& body,
                std::string& error, bool* sent = nullptr) {
    if (!transfer_write(framed, deadline, error)) return false;
    if (sent) *sent = true;
    std::string header(4, '\0');
    if (!transfer_read(header, deadline, error)) return false;
    uint32_t n;
    std::memcpy(&n, header.data(), 4);
    if (n == 0 || n > proto::kMaxBodyBytes) {
      drop();
      throw Error(ErrorCode::kIoError, where() + ": bad response length " + std::to_string(n));
    }
    body.clear();
    if (!transfer(
            "read",
            [&](auto done) {
              asio::async_read(*socket, asio::dynamic_buffer(body), asio::transfer_exactly(n),
                               done);
            },
            deadline, error)) {
      return false;
    }
    last_used = Clock::now();
    return true;
  }

  // Sends one request, reconnecting and sending it again after a broken connection until
  // `deadline` (see Repeat), and returns the response body (status first). `frame` builds the
  // request for each attempt; `io_grace` extends each attempt's I/O past the deadline (a wait's
  // answer comes at its deadline). `op` names the request in errors.
  std::string request(const std::string& op, Repeat repeat, Clock::time_point deadline,
                      const std::function<std::string()>& frame,
                      Clock::duration io_grace = Clock::duration::zero()) {
    // Another thread's request on this client's one connection goes first, within this one's
    // deadline (another thread's wait may hold it as long as its own timeout).
    std::string other;
    if (!turn.take(deadline, op, other)) {
      throw Error(ErrorCode::kTimeout,
                  where() + ": " + op +
                      " timed out waiting for this client's connection, which another thread's " +
                      (other.empty() ? std::string("request") : other) +
                      " held throughout (a TCPStore sends one request at a time; use a store per "
                      "thread for long waits)");
    }
    TurnHeld held(turn, std::adopt_lock);
    std::string broken;  // why the connection last broke under this request
    bool maybe_applied = false;
    std::string sent_to;  // the server instance that may have applied it
    auto pause = std::chrono::milliseconds(10);
    while (true) {
      if (socket && !usable()) drop();
      if (!socket) {
        std::string error;
        if (!connect(deadline, error)) {
          throw Error(ErrorCode::kTimeout,
                      where() + ": " + op + " failed: " +
                          (broken.empty() ? "could not connect before the timeout (" + error + ")"
                                          : "the connection broke (" + broken +
                                                ") and the server could not be reached again "
                                                "before the deadline (" +
                                                error + ")") +
                          hosting_note());
        }
        if (maybe_applied && repeat == Repeat::kOnlyIfUnapplied && server_id == sent_to) {
          throw Error(ErrorCode::kIoError,
                      where() + ": " + op + " failed: the connection broke (" + broken +
                          ") after the request was sent; it may or may not have been applied");
        }
      }
      const std::string framed = frame();
      if (framed.size() - 4 > server_max_message) {
        throw Error(ErrorCode::kInvalidArgument,
                    where() + ": " + op + ": the request is " + std::to_string(framed.size() - 4) +
                        " bytes, more than the server takes (" +
                        std::to_string(server_max_message) + " bytes; its max_message_bytes)");
      }
      std::string error, body;
      bool sent = false;
      if (exchange(framed, detail::deadline_after(io_grace, deadline), body, error, &sent)) {
        return body;
      }
      if (error.find("timed out") != std::string::npos) {
        throw Error(ErrorCode::kTimeout, where() + ": " + op + " failed: " + error);
      }
      // Closed or reset: the server went, restarted, or closed this connection as idle.
      broken = error;
      if (sent) {
        maybe_applied = true;
        sent_to = server_id;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        throw Error(ErrorCode::kIoError, where() + ": " + op + " failed: " + error);
      }
      TUTTI_LOG_DEBUG("{}: {}: {}; reconnecting", where(), op, error);
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }

  std::string request(const std::string& op, Repeat repeat, Clock::time_point deadline,
                      const proto::Writer& w) {
    const std::string framed = w.framed();
    return request(op, repeat, deadline, [&] { return framed; });
  }
};

TCPStore::TCPStore(std::string host, uint16_t port, TCPStoreOptions options)
    : Store(options.timeout), impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  impl_->secret = options.secret;
  if (options.tls) {
    impl_->tls = detail::asio_context(
        detail::make_psk_context(/*server=*/false, options.secret, "tutti store"));
  }
  if (options.host) {
    try {
      TCPStoreServerOptions server_options = options.server;
      server_options.secret = options.secret;
      server_options.tls = options.tls;
      impl_->server = host_server(impl_->host, port, server_options);
      impl_->port = impl_->server->port();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnavailable || port == 0) throw;
      // Another process (a launcher, tutti-store, an earlier rank 0) serves this address, or
      // another program holds the port: the handshake tells which.
      impl_->hosting_error = "address already in use";
      TUTTI_LOG_DEBUG("{}: address in use; connecting as a client", impl_->where());
    }
  }
}

TCPStore::~TCPStore() {
  TurnHeld held(impl_->turn, "the client's destruction");
  if (impl_->socket) impl_->drop();
}

const std::string& TCPStore::host() const {
  return impl_->host;
}
uint16_t TCPStore::port() const {
  return impl_->port;
}
bool TCPStore::is_hosting() const {
  return impl_->server != nullptr;
}

namespace {
proto::Status status_of(const std::string& body) {
  return static_cast<proto::Status>(body[0]);
}
}  // namespace

void TCPStore::set(const std::string& key, const std::string& value) {
  check_key(impl_->where(), key);
  check_value(impl_->where(), key, value);
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kSet)).str(key).str(value);
  impl_->request("set '" + key + "'", Repeat::kSafe, deadline_after(timeout()), w);
}

std::string TCPStore::get(const std::string& key) {
  wait({key}, timeout());
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kGet)).str(key);
  const std::string body =
      impl_->request("get '" + key + "'", Repeat::kSafe, deadline_after(timeout()), w);
  if (status_of(body) != proto::Status::kOk) {
    throw detail::store_timeout("TCPStore", timeout(), {key});  // deleted after the wait
  }
  proto::Reader r(body.data() + 1, body.size() - 1);
  std::string value = r.str(proto::kMaxValueBytes);
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed get response");
  return value;
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  check_key(impl_->where(), key);
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kAdd)).str(key).i64(delta);
  const std::string body =
      impl_->request("add '" + key + "'", Repeat::kOnlyIfUnapplied, deadline_after(timeout()), w);
  proto::Reader r(body.data() + 1, body.size() - 1);
  if (status_of(body) == proto::Status::kError) {
    const std::string message = r.str(proto::kMaxValueBytes);
    // The server's error code follows the message (servers from before it send none).
    ErrorCode code = ErrorCode::kInvalidUsage;
    if (r.ok() && !r.done()) {
      const uint8_t c = r.u8();
      if (r.done() && c <= static_cast<uint8_t>(ErrorCode::kInternal))
        code = static_cast<ErrorCode>(c);
    }
    throw Error(code, message);
  }
  const int64_t value = r.i64();
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed add response");
  return value;
}

std::string TCPStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  check_key(impl_->where(), key);
  check_value(impl_->where(), key, expected);
  check_value(impl_->where(), key, desired);
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kCompareSet)).str(key).str(expected).str(desired);
  const std::string body = impl_->request("compare_set '" + key + "'", Repeat::kOnlyIfUnapplied,
                                          deadline_after(timeout()), w);
  proto::Reader r(body.data() + 1, body.size() - 1);
  std::string value = r.str(proto::kMaxValueBytes);
  if (!r.done()) {
    throw Error(ErrorCode::kIoError, impl_->where() + ": malformed compare_set response");
  }
  return value;
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  check_keys(impl_->where(), keys);
  const auto deadline = deadline_after(timeout);
  // Errors of the request name the keys (the first few).
  std::string op = "wait for key(s) ";
  for (size_t i = 0; i < keys.size() && i < 3; ++i) op += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 3) op += " and " + std::to_string(keys.size() - 3) + " more";
  while (true) {
    // The server is asked for a slice of the wait at a time (at most kWaitSliceMs), and the
    // slice bounds the request's I/O too: a server that goes silent (its host gone, no reset)
    // is noticed at the slice's end, not at the whole wait's (never, for an infinite one).
    const auto slice_end =
        std::min(deadline, deadline_after(std::chrono::milliseconds(kWaitSliceMs)));
    // Each attempt (a reconnection is one) asks for what is left of the slice.
    const auto frame = [&] {
      proto::Writer w;
      w.u8(static_cast<uint8_t>(proto::Command::kWait)).i64(detail::time_left(slice_end).count());
      w.u32(static_cast<uint32_t>(keys.size()));
      for (const auto& k : keys) w.str(k);
      return w.framed();
    };
    const std::string body = impl_->request(op, Repeat::kSafe, slice_end, frame, kWaitGrace);
    if (status_of(body) == proto::Status::kOk) return;
    if (Clock::now() < deadline) continue;  // the server answered a slice of a longer wait
    throw detail::store_timeout("TCPStore", timeout, detail::missing_keys(*this, keys));
  }
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  check_keys(impl_->where(), keys);
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kCheck)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  const std::string body = impl_->request("check", Repeat::kSafe, deadline_after(timeout()), w);
  return body.size() == 2 && body[1] == 1;
}

bool TCPStore::delete_key(const std::string& key) {
  check_key(impl_->where(), key);
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kDelete)).str(key);
  // Repeating a delete deletes nothing more, though the second answer may say "was absent".
  const std::string body =
      impl_->request("delete '" + key + "'", Repeat::kSafe, deadline_after(timeout()), w);
  return body.size() == 2 && body[1] == 1;
}

int64_t TCPStore::num_keys() {
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kNumKeys));
  const std::string body = impl_->request("num_keys", Repeat::kSafe, deadline_after(timeout()), w);
  proto::Reader r(body.data() + 1, body.size() - 1);
  const int64_t n = r.i64();
  if (!r.done()) throw Error(ErrorCode::kIoError, impl_->where() + ": malformed num_keys response");
  return n;
}

void TCPStore::set_on_close(const std::string& key, const std::string& value) {
  check_key(impl_->where(), key);
  check_value(impl_->where(), key, value);
  // Listed first, so that a reconnection during the request registers it too (twice on one
  // connection is harmless: the key is set twice).
  {
    TurnHeld held(impl_->turn, "set_on_close");
    impl_->on_close.emplace_back(key, value);
  }
  const auto unlist = [&] {
    TurnHeld held(impl_->turn, "set_on_close");
    auto& list = impl_->on_close;
    for (auto it = list.rbegin(); it != list.rend(); ++it) {
      if (it->first == key && it->second == value) {
        list.erase(std::next(it).base());
        break;
      }
    }
  };
  proto::Writer w;
  w.u8(static_cast<uint8_t>(proto::Command::kSetOnClose)).str(key).str(value);
  std::string body;
  try {
    body =
        impl_->request("set_on_close '" + key + "'", Repeat::kSafe, deadline_after(timeout()), w);
  } catch (...) {
    unlist();
    throw;
  }
  if (status_of(body) == proto::Status::kError) {
    unlist();
    proto::Reader r(body.data() + 1, body.size() - 1);
    throw Error(ErrorCode::kInvalidUsage, impl_->where() + ": " + r.str(proto::kMaxValueBytes));
  }
}

}  // namespace tutti
