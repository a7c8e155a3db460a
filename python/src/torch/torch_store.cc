#include "torch_store.h"

#include <c10/util/Exception.h>

#include <thread>

#include "tutti/error.h"
#include "tutti/op_type.h"

namespace tutti::torch_backend {
namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

// torch's store errors as tutti's: a wait that timed out is kTimeout (tutti's rendezvous names
// the missing ranks from it), anything else kIoError; both quote torch's message.
template <typename F>
auto call(const char* op, const std::vector<std::string>& keys, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::DistStoreError& e) {
    const std::string what = e.what_without_backtrace();
    const bool timed_out =
        what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
    throw Error(timed_out ? ErrorCode::kTimeout : ErrorCode::kIoError,
                std::string("torch.distributed store: ") + op + " of " + names + ": " + what);
  } catch (const c10::Error& e) {
    throw Error(ErrorCode::kIoError,
                std::string("torch.distributed store: ") + op + ": " + e.what_without_backtrace());
  }
}

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout)
    : Store(timeout), store_(std::move(store)) {}

void TorchStore::set(const std::string& key, const std::string& value) {
  call("set", {key}, [&] { store_->set(key, bytes(value)); });
}

std::string TorchStore::get(const std::string& key) {
  wait({key}, timeout());
  return call("get", {key}, [&] { return text(store_->get(key)); });
}

int64_t TorchStore::add(const std::string& key, int64_t delta) {
  return call("add", {key}, [&] { return store_->add(key, delta); });
}

std::string TorchStore::compare_set(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return call("compare_set", {key},
              [&] { return text(store_->compareSet(key, bytes(expected), bytes(desired))); });
}

void TorchStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  // By looking, not torch's own wait: tutti's rendezvous waits often and briefly, and each of
  // torch's TCPStore waits that times out logs a warning. The looks back off to 10 ms.
  const auto deadline = deadline_after(timeout);
  auto nap = std::chrono::microseconds(200);
  while (!check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw Error(ErrorCode::kTimeout, "torch.distributed store: wait for " + names +
                                           ": not there after " + std::to_string(timeout.count()) +
                                           " ms");
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        nap, deadline - std::chrono::steady_clock::now()));
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(10));
  }
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  return call("check", keys, [&] { return store_->check(keys); });
}

bool TorchStore::delete_key(const std::string& key) {
  return call("delete_key", {key}, [&] { return store_->deleteKey(key); });
}

int64_t TorchStore::num_keys() {
  return call("num_keys", {}, [&] { return store_->getNumKeys(); });
}

}  // namespace tutti::torch_backend
