// RedisStore: the Store interface over a Redis server, for clusters that already run one.
//
//   redis://host:port[/db][?prefix=P&password=W]
//
// Every key is stored under the prefix (default "tutti/"), so one Redis can serve many jobs;
// num_keys() counts the keys under it. compare_set is one Lua script (atomic on the server);
// wait polls with a short back-off until its deadline. Thread-safe (requests are serialised on
// one connection, which is re-made after a failure). Throws Error(kUnavailable) where tutti was
// built without hiredis.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tutti/store.h"

namespace tutti {

struct RedisStoreOptions {
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  int db = 0;
  std::string prefix = "tutti/";
  std::string password;  // AUTH when non-empty
};

class TUTTI_API RedisStore : public Store {
 public:
  RedisStore(std::string host, uint16_t port, RedisStoreOptions options = {});
  ~RedisStore() override;

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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti
