#include "tutti/prefix_store.h"

#include "store/store_util.h"
#include "tutti/error.h"

namespace tutti {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultTimeout),
      prefix_(std::move(prefix)),
      store_(std::move(store)) {
  if (!store_) throw Error(ErrorCode::kInvalidArgument, "PrefixStore needs a store, got null");
}

PrefixStore::~PrefixStore() = default;

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(full(key));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  store_->set(full(key), value);
}

std::string PrefixStore::get(const std::string& key) {
  // This store's timeout applies, not the underlying store's.
  store_->wait({full(key)}, timeout());
  return store_->get(full(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(full(key), delta);
}

std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return store_->compare_set(full(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    store_->wait(full(keys), timeout);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
    // Name the keys as this store's caller knows them.
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!store_->check({full(key)})) missing.push_back(key);
    }
    throw detail::store_timeout(("PrefixStore '" + prefix_ + "'").c_str(), timeout, missing);
  }
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(full(keys));
}

bool PrefixStore::delete_key(const std::string& key) {
  return store_->delete_key(full(key));
}

int64_t PrefixStore::num_keys() {
  return store_->num_keys();
}

}  // namespace tutti
