// Store: the key-value rendezvous through which the ranks of a group find each other.
//
// Implementations: HashStore (one process), FileStore (one host or a shared file system),
// TCPStore (the default: hosted by rank 0 or tutti-store), RedisStore, PrefixStore (a namespace
// inside another store). All implementations are safe to call from several threads at once.
//
// Values are byte strings (std::string holds any bytes). Every blocking call has a deadline:
// `get` and `wait` throw Error(kTimeout) naming the missing keys when it passes. A timeout too
// long for the clock (std::chrono::milliseconds::max()) means no deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/export.h"

namespace tutti {

class TUTTI_API Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{30000};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const std::string& value) = 0;

  // Waits up to timeout() for the key to exist, then returns its value.
  virtual std::string get(const std::string& key) = 0;

  // Atomically adds delta to the integer stored at key (a missing key counts as 0) and returns
  // the new value. Values written by add are decimal text.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if the key's value equals `expected` (or the key is missing and `expected` is
  // empty), sets it to `desired`. Returns the value the key holds afterwards, so the caller
  // won exactly when the result equals `desired`.
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Waits until every key exists; throws Error(kTimeout) listing the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;

  virtual int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  std::chrono::milliseconds timeout_;
};

// Opens a store from a URL:
//   tcp://host:port[?secret=S]  a TCPStore client; with `host` set, this process also serves
//                               the address (rank 0 does) unless another process already does.
//                               The secret may come from TUTTI_STORE_SECRET instead.
//   redis://host:port[/db][?prefix=P&password=W]  a RedisStore
//   file:///path/to/file        a FileStore on that file
//   hash://                     a new, private HashStore (useful for world size 1)
//   env://                      the launcher's store (read_launch_env() in tutti/env.h: what
//                               tutti-run, torchrun, srun or mpirun set), opened as above
TUTTI_API std::shared_ptr<Store> open_store(
    const std::string& url, std::chrono::milliseconds timeout = Store::kDefaultTimeout,
    bool host = false);

}  // namespace tutti
