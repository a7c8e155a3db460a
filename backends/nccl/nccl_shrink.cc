// The survivors' NCCL communicators after a failure, through ncclCommShrink (NcclBackend::shrink).
//
// CollectiveGroup::shrink has aborted the failed group, so its watchdog has revoked the
// communicators (ncclCommRevoke: stopped, kept). Each survivor says through the survivors' store
// which collective communicators it holds (by the order they were made in, which every rank
// shares), and they shrink those that all hold, in that order, without the NCCL ranks of the
// ranks left out: NCCL renumbers the rest to fill the gaps, as the group does. Then each says
// whether its shrink worked; unless all did, every survivor aborts what it shrank and the factory
// makes new communicators through the store (the fallback, as without ncclCommShrink). The
// failed group's communicators stay with it and are aborted, never destroyed, with it.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "nccl_api.h"
#include "nccl_backend.h"
#include "nccl_types.h"
#include "nccl_util.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::nccl_backend {
namespace {

using Clock = std::chrono::steady_clock;

// "n:k;" for each collective communicator n (over k devices) a rank holds.
std::string encode(const std::map<int, int>& held) {
  std::string out;
  for (const auto& [n, k] : held) out += std::to_string(n) + ":" + std::to_string(k) + ";";
  return out;
}

std::map<int, int> decode(const std::string& text) {
  std::map<int, int> held;
  size_t at = 0;
  while (at < text.size()) {
    const size_t colon = text.find(':', at);
    const size_t end = text.find(';', at);
    if (colon == std::string::npos || end == std::string::npos || colon > end) break;
    held[std::atoi(text.substr(at, colon - at).c_str())] =
        std::atoi(text.substr(colon + 1, end - colon - 1).c_str());
    at = end + 1;
  }
  return held;
}

std::string ok_key(int rank) {
  return "nccl/shrink/ok/" + std::to_string(rank);
}

}  // namespace

std::unique_ptr<Backend> NcclBackend::shrink(const BackendContext& sub) {
  const auto deadline = deadline_after(sub.timeout);
  // The first quarter of the budget for this rank's own state: the watchdog's revokes, then each
  // revoked communicator becoming quiescent. One that does not is left out (every survivor then
  // leaves it out: the agreement below), so that ncclCommShrink never has to stop work itself
  // (NCCL_SHRINK_ABORT would run NCCL's abort on this thread, which may wait on a stalled
  // stream) and a survivor late here does not make the others' store waits time out.
  const auto own_deadline = deadline_after(sub.timeout / 4);
  std::map<int, int> held;
  std::map<int, Comms*> by_index;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_until(lock, own_deadline, [&] { return stopped_; });
    if (stopped_ && api_.CommShrink != nullptr) {
      for (auto& [key, c] : collective_) {
        if (std::find(c->comms.begin(), c->comms.end(), nullptr) != c->comms.end()) continue;
        by_index[c->index] = c.get();
      }
    }
  }
  // Once stopped, the watchdog makes no NCCL call and no op enters (the group holds its op lock):
  // the parent's communicators are this thread's.
  for (auto& [n, c] : by_index) {
    bool quiet = true;
    for (ncclComm_t comm : c->comms) {
      ncclResult_t state = ncclInProgress;
      while (api_.CommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < own_deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      quiet = quiet && state == ncclSuccess;
    }
    if (quiet) held[n] = static_cast<int>(c->devices.size());
  }
  // Said even when empty (this NCCL cannot shrink): the others then fall back too.
  sub.store->set("nccl/shrink/held/" + std::to_string(sub.rank), encode(held));
  std::map<int, int> common = held;
  for (int r = 0; r < sub.world_size; ++r) {
    if (r == sub.rank) continue;
    const std::map<int, int> theirs =
        decode(sub.store->get("nccl/shrink/held/" + std::to_string(r)));
    for (auto it = common.begin(); it != common.end();) {
      auto found = theirs.find(it->first);
      it = found == theirs.end() || found->second != it->second ? common.erase(it) : std::next(it);
    }
  }
  if (common.empty()) {
    TUTTI_LOG_INFO("nccl: shrink makes new communicators ({})",
                   api_.CommShrink == nullptr ? "this NCCL has no ncclCommShrink or ncclCommRevoke"
                   : held.empty()
                       ? "this rank holds no quiescent collective communicator"
                       : "no quiescent collective communicator is held by every survivor");
    return nullptr;
  }
  std::vector<Comms*> parents;
  for (const auto& [n, k] : common) parents.push_back(by_index[n]);

  // What was shrunk is abandoned on every way out but the one that hands it over.
  struct Made {
    const NcclBackend& backend;
    std::vector<std::unique_ptr<Comms>> comms;
    ~Made() {
      for (auto& c : comms) backend.abandon(*c);
    }
  } made{*this, {}};
  std::string failed;
  try {
    shrink_comms(parents, sub, deadline, made.comms);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  sub.store->set(ok_key(sub.rank), failed.empty() ? "1" : failed);
  for (int r = 0; r < sub.world_size && failed.empty(); ++r) {
    if (r == sub.rank) continue;
    const std::string ok = sub.store->get(ok_key(r));
    if (ok != "1") failed = "rank " + std::to_string(r) + ": " + ok;
  }
  if (!failed.empty()) {
    TUTTI_LOG_WARN("nccl: ncclCommShrink failed ({}); making new communicators instead", failed);
    return nullptr;  // `made` aborts what this rank shrank
  }
  // The survivors' backend starts with the shrunk communicators as its first ones, in order.
  auto shrunk = std::make_unique<NcclBackend>(sub);
  const size_t count = made.comms.size();
  {
    std::lock_guard<std::mutex> lock(shrunk->mutex_);  // its watchdog reads the maps
    for (auto& c : made.comms) {
      c->index = shrunk->collective_count_++;
      const std::string key = device_list_key(c->devices);
      shrunk->collective_.emplace(key, std::move(c));
    }
    made.comms.clear();
  }
  std::string without;
  for (int r : sub.shrunk_without) without += (without.empty() ? "" : ",") + std::to_string(r);
  TUTTI_LOG_INFO("nccl: shrank {} communicator(s) without rank(s) {} (ncclCommShrink)", count,
                 without.empty() ? "none" : without);
  return shrunk;
}

void NcclBackend::shrink_comms(const std::vector<Comms*>& parents, const BackendContext& sub,
                               std::chrono::steady_clock::time_point deadline,
                               std::vector<std::unique_ptr<Comms>>& made) {
  auto check = [&](ncclResult_t r, ncclComm_t comm, const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = api_.GetLastError(comm);
    throw Error(ErrorCode::kInternal,
                "nccl: " + what + " failed: " + api_.GetErrorString(r) +
                    (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : ""));
  };
  std::vector<ncclComm_t> all;
  {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking_communicators() ? 1 : 0;
    // One group: NCCL requires it when one thread makes communicators on several devices.
    NcclGroup group(api_);
    check(group.start(), nullptr, "ncclGroupStart");
    for (Comms* p : parents) {
      const int k = static_cast<int>(p->devices.size());
      std::vector<int> excluded;
      for (int r : sub.shrunk_without) {
        for (int i = 0; i < k; ++i) excluded.push_back(nccl_rank(r, k, i));
      }
      made.push_back(std::make_unique<Comms>());
      Comms& c = *made.back();
      c.devices = p->devices;
      c.nranks = sub.world_size * k;
      c.first_rank = nccl_rank(sub.rank, k, 0);
      c.comms.assign(p->devices.size(), nullptr);
      for (size_t i = 0; i < p->devices.size(); ++i) {
        DeviceGuard guard(p->devices[i]);
        // Every parent here is revoked and quiescent: NCCL_SHRINK_DEFAULT.
        check(api_.CommShrink(p->comms[i], excluded.data(), static_cast<int>(excluded.size()),
                              &c.comms[i], &config, NCCL_SHRINK_DEFAULT),
              p->comms[i], "ncclCommShrink of collective communicator " + std::to_string(p->index));
        all.push_back(c.comms[i]);
      }
    }
    check(group.end(), nullptr, "ncclGroupEnd after ncclCommShrink");
  }
  // Until each new communicator is up; a survivor that failed says so under its ok key, and the
  // others stop waiting for it then rather than at the deadline.
  for (int polls = 0;; ++polls) {
    bool up = true;
    for (ncclComm_t comm : all) {
      ncclResult_t state = ncclInProgress;
      check(api_.CommGetAsyncError(comm, &state), comm, "ncclCommGetAsyncError");
      check(state, comm, "ncclCommShrink");
      up = up && state == ncclSuccess;
    }
    if (up) break;
    if (Clock::now() > deadline) {
      throw Error(
          ErrorCode::kTimeout,
          "nccl: ncclCommShrink was still in progress after " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::milliseconds>(sub.timeout).count()) +
              " ms (waiting for the other survivors)");
    }
    for (int r = 0; r < sub.world_size && polls % 16 == 15; ++r) {
      if (r == sub.rank || !sub.store->check({ok_key(r)})) continue;
      const std::string ok = sub.store->get(ok_key(r));
      if (ok != "1") throw Error(ErrorCode::kAborted, "rank " + std::to_string(r) + ": " + ok);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& c : made) make_streams(*c);
}

}  // namespace tutti::nccl_backend
