// A store whose waits end with an error once a condition holds (internal to the core).
//
// While a group is being made, its ranks wait in the store: for the members of a split (holding
// the parent's op lock), in their backend's rendezvous, in the round after it. Those waits must
// end when waiting is pointless, not at their timeout: when the parent is aborted or destroyed
// from another thread (kAborted), when another rank's backend failed (kRemoteError), or when a
// rank's process on this host exited (kIoError). A wait is
// cut into slices of at most kSlice and the condition checked before each, so it is seen within
// kSlice of turning true; calls that do not block pass straight through. Once disarmed it is a
// plain pass-through (a backend keeps the store it was made with).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "store/store_util.h"
#include "tutti/error.h"
#include "tutti/store.h"
#include "util/deadline.h"

namespace tutti::detail {

class StoppableStore final : public Store {
 public:
  static constexpr std::chrono::milliseconds kSlice{50};

  // Why to stop (a code and a message), or an empty message to go on.
  struct Stop {
    ErrorCode code = ErrorCode::kAborted;
    std::string why;
  };

  StoppableStore(std::shared_ptr<Store> inner, std::function<Stop()> stopped)
      : Store(inner->timeout()), inner_(std::move(inner)), stopped_(std::move(stopped)) {}

  // From now on no condition is checked.
  void disarm() { armed_.store(false); }

  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  std::string get(const std::string& key) override {
    wait({key}, timeout());
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = deadline_after(timeout);
    while (true) {
      check_stop();
      if (!armed_.load()) return inner_->wait(keys, time_left(deadline));
      const auto left = time_left(deadline);
      try {
        return inner_->wait(keys, std::min(left, kSlice));
      } catch (const Error& e) {
        // A slice ran out: the whole wait has not, unless the deadline passed too.
        if (e.code() != ErrorCode::kTimeout) throw;
        if (left <= kSlice) throw whole_wait_timeout(e, keys, timeout);
      }
    }
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  int64_t num_keys() override { return inner_->num_keys(); }

 private:
  // The last slice's timeout says the whole wait's: "timed out after 300000 ms", not after the
  // few milliseconds the slice had (the store named as the inner store named itself).
  Error whole_wait_timeout(const Error& e, const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
    if (timeout <= kSlice) return e;
    const std::string text = e.what();
    const size_t at = text.find(": timed out after ");
    return store_timeout(at == std::string::npos ? "store" : text.substr(0, at).c_str(), timeout,
                         missing_keys(*inner_, keys));
  }

  void check_stop() {
    if (!armed_.load()) return;
    const Stop stop = stopped_();
    if (!stop.why.empty()) throw Error(stop.code, stop.why);
  }

  std::shared_ptr<Store> inner_;
  std::function<Stop()> stopped_;
  std::atomic<bool> armed_{true};
};

}  // namespace tutti::detail
