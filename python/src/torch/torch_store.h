// torch.distributed's store as tutti's (tutti._torch): the process group's own store (a
// PrefixStore over torchrun's TCPStore, or the one given to init_process_group) carries tutti's
// rendezvous, so no second server is started.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tutti/store.h"

namespace tutti::torch_backend {

class TorchStore final : public Store {
 public:
  TorchStore(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout);

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
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace tutti::torch_backend
