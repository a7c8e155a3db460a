// Adapts a tutti::Store to the store interface Gloo's rendezvous uses (internal).
//
// Gloo's default wait(keys, timeout) ignores its timeout; this adapter honours it, and every
// wait without one uses the tutti store's own timeout.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>

#include "tutti/store.h"

namespace tutti::gloo_backend {

class GlooStore : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<tutti::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<tutti::Store> store_;
};

}  // namespace tutti::gloo_backend
