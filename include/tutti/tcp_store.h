// TCPStore: the embedded default store. One process hosts a TCPStoreServer (rank 0 inside its
// own process, the launcher, or the standalone tutti-store program); every rank talks to it as a
// client over TCP.
//
// Clients connect lazily and retry with back-off until their timeout, so ranks may start before
// the host. A client is thread-safe (requests are serialised on one connection: a request
// queued behind another thread's long wait ends at its own timeout, kTimeout naming that wait;
// give a thread that waits long a client of its own). When the connection breaks, the client
// reconnects until the request's deadline: requests that are safe to repeat are repeated; add
// and compare_set are repeated only when the request never left, or when the client reached a
// different server instance (a restarted one, which never saw it).
// A server that never comes back ends the request with kTimeout naming the address.
//
// Hosting: a server this process hosts on an explicit port is kept until the process exits,
// shared by every TCPStore of the process that hosts that address, so destroying a group and
// creating it again never takes the store away from ranks that already came back to it. A
// server hosted on port 0 stops when the last TCPStore hosting it goes.
//
// The optional shared secret (URL `?secret=...` or TUTTI_STORE_SECRET) is proven by each client
// with HMAC-SHA-256 over a nonce from the server before any command is served; it is never sent.
// A wrong or missing secret is Error(kInvalidArgument).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tutti/store.h"

namespace tutti {

// What a TCPStoreServer allows its clients.
struct TCPStoreServerOptions {
  std::string secret;  // empty: none
  // Every connection in TLS 1.3, keyed by `secret` (required): a pre-shared key derived from it,
  // so no certificates are needed. Clients must ask for TLS too (TCPStoreOptions::tls).
  bool tls = false;
  // Connections served at once. One more is accepted and closed at once; its client retries.
  size_t max_connections = 4096;
  // A connection that sends nothing for this long after its handshake is closed (zero: never).
  // A client blocked in a wait is not idle, nor is one that asked for set_on_close; a TCPStore
  // reconnects by itself.
  std::chrono::milliseconds idle_timeout = std::chrono::minutes(10);
  // The largest message one connection may send (a value may be 64 MiB; less refuses larger
  // values). Memory for a message is allocated as its bytes arrive, never from its length alone.
  size_t max_message_bytes = size_t(64 + 1) * 1024 * 1024;
  // Bytes all connections together may hold in partly received messages; a connection whose
  // next piece would pass this is closed.
  size_t max_buffered_bytes = size_t(512) * 1024 * 1024;
};

// A TCP store server running on a background thread.
//
// Binds the given host's address (loopback for "localhost"/"127.0.0.1"; "0.0.0.0" or "::" bind
// every interface, and warn when no secret is set); port 0 picks a free port, read with port().
// Every length and count received is checked against caps before allocating; a malformed,
// unauthenticated, stalled or idle connection is closed without disturbing the others. When
// accept() fails (out of file descriptors), the server pauses accepting with a back-off, and
// warns at most once per 10 s. Thread-safe to query from any thread.
// Throws Error(kUnavailable) when the address is in use, kIoError on other failures.
class TUTTI_API TCPStoreServer {
 public:
  TCPStoreServer(const std::string& host, uint16_t port, const std::string& secret = "");
  TCPStoreServer(const std::string& host, uint16_t port, TCPStoreServerOptions options);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  // A random id made when the server started, handed to clients as the key "tutti/store-nonce":
  // a job id for ranks that were given none.
  const std::string& nonce() const;

  // A snapshot, for monitoring and tests.
  struct Stats {
    size_t connections = 0;            // open, including ones still in the handshake
    size_t waiting = 0;                // connections blocked in a wait
    size_t buffered_bytes = 0;         // held in partly received messages
    uint64_t accept_errors = 0;        // accept() failures (e.g. out of file descriptors)
    uint64_t refused_connections = 0;  // closed at once: max_connections reached
    uint64_t idle_closed = 0;          // closed after idle_timeout
  };
  Stats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct TCPStoreOptions {
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  std::string secret;  // empty: none (TUTTI_STORE_SECRET is read by open_store)
  // TLS 1.3 keyed by `secret` (see TCPStoreServerOptions::tls), for this client and a hosted
  // server alike. open_store sets it from ?tls=1 or TUTTI_STORE_TLS=1.
  bool tls = false;
  // Host the server in this process (unless another process already serves the address, in
  // which case this store is a client of it).
  bool host = false;
  // The hosted server's limits (its secret is `secret` above).
  TCPStoreServerOptions server;
};

class TUTTI_API TCPStore : public Store {
 public:
  TCPStore(std::string host, uint16_t port, TCPStoreOptions options = {});
  ~TCPStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  // Asks the server to set `key` to `value` when this client's connection ends: when this
  // TCPStore is destroyed, or when its process exits, crashes or is killed. A host can so learn
  // at once that a peer is gone instead of waiting out a timeout. The registration is made again
  // on every reconnection; the key may thus also be set when the connection breaks and is
  // re-made. The connection is no longer closed as idle. Throws like set().
  void set_on_close(const std::string& key, const std::string& value);

  const std::string& host() const;
  uint16_t port() const;  // the bound port when this store hosts a server on port 0
  bool is_hosting() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti
