// TCPStore: the embedded default store. One process hosts a TCPStoreServer (rank 0 inside its
// own process, the launcher, or the standalone tutti-store program); every rank talks to it as a
// client over TCP.
//
// Clients connect lazily and retry with back-off until their timeout, so ranks may start before
// the host. A client is thread-safe (requests are serialised on one connection). Servers hosted
// in one process are shared by every TCPStore of that process that asks to host the same
// address, and stop when the last of them goes.
//
// The optional shared secret (URL `?secret=...` or TUTTI_STORE_SECRET) is proven by each client
// with HMAC-SHA-256 over a nonce from the server before any command is served; it is never sent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tutti/store.h"

namespace tutti {

// A TCP store server running on a background thread.
//
// Binds the given host's address (loopback for "localhost"/"127.0.0.1"; "0.0.0.0" or "::" bind
// every interface, and warn when no secret is set); port 0 picks a free port, read with port().
// Every length and count received is checked against caps before allocating; a malformed,
// unauthenticated or stalled connection is closed without disturbing the others.
// Throws Error(kUnavailable) when the address is in use, kIoError on other failures.
class TUTTI_API TCPStoreServer {
 public:
  TCPStoreServer(const std::string& host, uint16_t port, const std::string& secret = "");
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  // A random id made when the server started, handed to clients as the key "tutti/store-nonce":
  // a job id for ranks that were given none.
  const std::string& nonce() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct TCPStoreOptions {
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  std::string secret;  // empty: none (TUTTI_STORE_SECRET is read by open_store)
  // Host the server in this process (unless another process already serves the address, in
  // which case this store is a client of it).
  bool host = false;
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

  const std::string& host() const;
  uint16_t port() const;  // the bound port when this store hosts a server on port 0
  bool is_hosting() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti
