// A store whose calls end with kAborted once a condition holds (internal to the core).
//
// A split waits in the parent group's store (the members' meeting, the backend's rendezvous, the
// round after it) while it holds the parent's op lock; abort() or destroy() of the parent from
// another thread must end those waits, not leave them to their timeout. Every call checks the
// condition first, and a wait is cut into slices of at most kSlice, checking between them, so
// the condition is seen within kSlice of turning true. Once disarmed it is a plain pass-through
// (a backend keeps the store it was made with after the split is over).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/store.h"
#include "util/deadline.h"

namespace tutti::detail {

class StoppableStore final : public Store {
 public:
  static constexpr std::chrono::milliseconds kSlice{50};

  // `stopped` returns why to stop, or "" to go on.
  StoppableStore(std::shared_ptr<Store> inner, std::function<std::string()> stopped)
      : Store(inner->timeout()), inner_(std::move(inner)), stopped_(std::move(stopped)) {}

  // From now on no condition is checked.
  void disarm() { armed_.store(false); }

  void set(const std::string& key, const std::string& value) override {
    check_stop();
    inner_->set(key, value);
  }
  std::string get(const std::string& key) override {
    wait({key}, timeout());
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    check_stop();
    return inner_->add(key, delta);
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    check_stop();
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
        if (e.code() != ErrorCode::kTimeout || left <= kSlice) throw;
      }
    }
  }
  bool check(const std::vector<std::string>& keys) override {
    check_stop();
    return inner_->check(keys);
  }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  int64_t num_keys() override { return inner_->num_keys(); }

 private:
  void check_stop() {
    if (!armed_.load()) return;
    const std::string why = stopped_();
    if (!why.empty()) throw Error(ErrorCode::kAborted, why);
  }

  std::shared_ptr<Store> inner_;
  std::function<std::string()> stopped_;
  std::atomic<bool> armed_{true};
};

}  // namespace tutti::detail
