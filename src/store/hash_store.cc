#include "tutti/hash_store.h"

#include "store/store_util.h"
#include "util/deadline.h"

namespace tutti {

HashStore::HashStore(std::chrono::milliseconds timeout) : Store(timeout) {}
HashStore::~HashStore() = default;

void HashStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

std::string HashStore::get(const std::string& key) {
  wait({key}, timeout());
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    value = detail::add_to_counter(key, it == map_.end() ? nullptr : &it->second, delta);
    map_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string HashStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (!expected.empty()) return expected;  // c10d: a missing key answers `expected`
      map_[key] = desired;
      result = desired;
    } else {
      if (it->second == expected) it->second = desired;
      result = it->second;
    }
  }
  changed_.notify_all();
  return result;
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (map_.count(key) == 0) return false;
    }
    return true;
  };
  // wait_until on a saturated deadline: wait_for(milliseconds::max()) would overflow.
  if (changed_.wait_until(lock, detail::deadline_after(timeout), all_present)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (map_.count(key) == 0) missing.push_back(key);
  }
  throw detail::store_timeout("HashStore", timeout, missing);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (map_.count(key) == 0) return false;
  }
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

}  // namespace tutti
