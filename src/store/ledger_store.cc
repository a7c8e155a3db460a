#include "store/ledger_store.h"

#include <cstdlib>

#include "tutti/error.h"

namespace tutti::detail {

LedgerStore::LedgerStore(std::shared_ptr<Store> inner, std::string ledger)
    : Store(inner ? inner->timeout() : kDefaultTimeout),
      inner_(std::move(inner)),
      ledger_(std::move(ledger)) {
  if (!inner_) throw Error(ErrorCode::kInvalidArgument, "LedgerStore needs a store, got null");
}

void LedgerStore::note(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!noted_.insert(key).second) return;
  // Noted before it is written: a process that dies in between leaves nothing unnoted.
  const int64_t n = inner_->add(ledger_ + "/n", 1);
  inner_->set(ledger_ + "/" + std::to_string(n), key);
}

void LedgerStore::set(const std::string& key, const std::string& value) {
  note(key);
  inner_->set(key, value);
}

std::string LedgerStore::get(const std::string& key) {
  inner_->wait({key}, timeout());  // this store's timeout, not the inner one's
  return inner_->get(key);
}

int64_t LedgerStore::add(const std::string& key, int64_t delta) {
  note(key);
  return inner_->add(key, delta);
}

std::string LedgerStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  note(key);
  return inner_->compare_set(key, expected, desired);
}

void LedgerStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  inner_->wait(keys, timeout);
}

bool LedgerStore::check(const std::vector<std::string>& keys) {
  return inner_->check(keys);
}

bool LedgerStore::delete_key(const std::string& key) {
  return inner_->delete_key(key);
}

int64_t LedgerStore::num_keys() {
  return inner_->num_keys();
}

size_t purge_ledger(Store& store, const std::string& ledger) {
  const std::string count_key = ledger + "/n";
  if (!store.check({count_key})) return 0;
  const int64_t n = std::atoll(store.get(count_key).c_str());
  size_t deleted = 0;
  for (int64_t i = 1; i <= n; ++i) {
    const std::string entry = ledger + "/" + std::to_string(i);
    if (!store.check({entry})) continue;  // its writer died between counting and noting
    if (store.delete_key(store.get(entry))) ++deleted;
    store.delete_key(entry);
  }
  store.delete_key(count_key);
  return deleted;
}

}  // namespace tutti::detail
