// HashStore: an in-memory Store for ranks that are threads of one process (tests, world size
// 1). Thread-safe; waits block on a condition variable, never spin.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "tutti/store.h"

namespace tutti {

class TUTTI_API HashStore : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultTimeout);
  ~HashStore() override;

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
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> map_;
};

}  // namespace tutti
