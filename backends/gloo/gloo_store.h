// Adapts a tutti::Store to the store interface Gloo's rendezvous uses (internal).
//
// Gloo's default wait(keys, timeout) ignores its timeout; this adapter honours it, and every
// wait without one uses the tutti store's own timeout. It also hands the pair addresses that
// connectFullMesh exchanges (under each rank's number) to a callback (GlooConnections::record).
#pragma once

#include <gloo/rendezvous/store.h>

#include <cctype>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tutti/store.h"

namespace tutti::gloo_backend {

class GlooStore : public ::gloo::rendezvous::Store {
 public:
  using OnAddresses = std::function<void(int rank, const std::vector<char>& addresses)>;

  explicit GlooStore(std::shared_ptr<tutti::Store> store, OnAddresses on_addresses = nullptr)
      : store_(std::move(store)), on_addresses_(std::move(on_addresses)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
    notice(key, data);
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key);
    std::vector<char> data(value.begin(), value.end());
    notice(key, data);
    return data;
  }

  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  // A key that is a rank's number holds that rank's pair addresses.
  void notice(const std::string& key, const std::vector<char>& data) {
    if (!on_addresses_ || key.empty() || key.size() > 9) return;
    for (char c : key) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return;
    }
    on_addresses_(std::stoi(key), data);
  }

  std::shared_ptr<tutti::Store> store_;
  OnAddresses on_addresses_;
};

}  // namespace tutti::gloo_backend
