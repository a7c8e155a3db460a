// A store that notes, in the store itself, each key written through it, so that the keys of a
// group's incarnation can be deleted once no rank uses them (internal to the core).
//
// A group's incarnation writes keys of its own (rank claims, backend rendezvous, subgroups'
// meetings); on a long-lived store (a file, Redis, tutti-store) they would stay forever, a few
// kilobytes per group lifetime. Each key is noted before it is first written: `<ledger>/n` counts
// the notes, `<ledger>/<i>` holds the i-th key. purge_ledger() deletes them all.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "tutti/store.h"

namespace tutti::detail {

class LedgerStore final : public Store {
 public:
  LedgerStore(std::shared_ptr<Store> inner, std::string ledger);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  void note(const std::string& key);

  std::shared_ptr<Store> inner_;
  const std::string ledger_;
  std::mutex mutex_;
  std::set<std::string> noted_;  // by this instance (other ranks note theirs)
};

// Deletes every key noted under `ledger`, then the ledger. Returns how many keys it deleted.
size_t purge_ledger(Store& store, const std::string& ledger);

}  // namespace tutti::detail
