// What a consumer's get and borrow share (internal to the direct transport): the resolution of
// a ref, the lease a get holds while it copies and the registration of its cancel flag
// (consumer.cc, consumer_lease.cc, workers.cc).
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "transfer/peers.h"

namespace tutti::detail {

// What a get or a borrow needs from the resolution of a ref.
struct AgentCore::Resolved {
  TensorRef ref;     // with its publication (a pending ref once fulfilled)
  std::string name;  // the transport used (after a fallback to the socket)
  TensorTransport* transport = nullptr;
  bool local = false;  // the owner is on this host (a lease lane)
  std::shared_ptr<Peer> peer;
  TensorRef given;         // across: the ref as given (ref: as the transport used reads it)
  bool republish = false;  // another host: the owner is asked to publish it on `name` first
  bool across = false;     // it was: a failure there may still take the socket stream
  // Across, the first get over `name` from this owner (none has arrived over it yet): it has
  // half the time left (trial_until), the rest is the socket stream's where it does not finish.
  bool trial = false;
};

// A lease taken for one get: a get that fails, is cancelled or times out gives it back on the way
// out (with a second of its own for the messages, its deadline may be gone).
class LeaseGuard {
 public:
  LeaseGuard(AgentCore& core, const AgentCore::Resolved& r, AgentCore::Lease lease);
  ~LeaseGuard();
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;
  // The get completed: the lease ends, counted as a get.
  void complete(PeerLink& link);
  // The caller keeps the lease from now on.
  AgentCore::Lease release();

 private:
  AgentCore& core_;
  const AgentCore::Resolved& r_;
  AgentCore::Lease lease_;
  bool held_ = true;
};

// Registers a get's cancel flag for abort() while it runs.
class ActiveGet {
 public:
  ActiveGet(AgentCore& core, std::atomic<bool>* flag) : core_(core), flag_(flag) {
    std::lock_guard<std::mutex> lock(core_.active_mutex);
    core_.active.push_back(flag_);
  }
  ~ActiveGet() {
    std::lock_guard<std::mutex> lock(core_.active_mutex);
    auto& a = core_.active;
    auto it = std::find(a.begin(), a.end(), flag_);
    if (it != a.end()) {
      *it = a.back();
      a.pop_back();
    }
  }

 private:
  AgentCore& core_;
  std::atomic<bool>* flag_;
};

}  // namespace tutti::detail
