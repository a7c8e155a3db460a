// The two-sided transports' lanes (group_transport.h): a pair's order of transfers, its queue,
// the thread and the two-rank group that carry them, and what a failure does to them.
#include <algorithm>

#include "transfer/group_transport.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// A lane's thread looks for work every kWatchSlice (a cancel of a receive a consumer's thread
// runs is seen within two); after a second without work, it dozes in longer slices (woken by a
// consumer that takes the lane).
constexpr int kWatchfulSlices = 50;
constexpr std::chrono::milliseconds kDozeSlice{100};

// Rounded up: a group's timeout must not end an op before the deadline it stands for.
std::chrono::milliseconds ms_until(Clock::time_point t) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()));
}

}  // namespace

GroupTransport::Lane& GroupTransport::lane_locked(int peer, const std::string& peer_agent) {
  if (shut_) {
    throw Error(ErrorCode::kAborted,
                "transport '" + name_ + "' of agent '" + agent_ + "': the agent is going");
  }
  auto it = lanes_.find(peer);
  if (it != lanes_.end()) {
    if (it->second->peer_agent != peer_agent) {
      throw Error(ErrorCode::kInvalidUsage, "transport '" + name_ + "' of agent '" + agent_ +
                                                "': rank " + std::to_string(peer) + " of group '" +
                                                set_ + "' was agent " + it->second->peer_agent +
                                                ", now agent " + peer_agent);
    }
    return *it->second;
  }
  auto lane = std::make_shared<Lane>(peer, peer_agent);
  lane->thread = std::thread([this, lane] { run_lane(lane); });  // before it is listed
  lanes_[peer] = lane;
  return *lane;
}

void GroupTransport::abort_for_lane(const Lane& lane, const std::shared_ptr<CollectiveGroup>& base,
                                    const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lane.stopping || group_ != base) return;
  }
  abort(reason);
}

std::vector<std::shared_ptr<GroupTransport::Lane>> GroupTransport::take_lanes_locked() {
  std::vector<std::shared_ptr<Lane>> out;
  for (auto& [peer, lane] : lanes_) {
    lane->stopping = true;
    out.push_back(std::move(lane));
  }
  lanes_.clear();
  return out;
}

void GroupTransport::stop_lanes(const std::vector<std::shared_ptr<Lane>>& lanes) {
  work_.notify_all();
  // Destroying a pair's group ends a batch running on it; a lane that makes its group after
  // this destroys it itself (it sees `stopping`).
  for (const auto& lane : lanes) {
    std::shared_ptr<CollectiveGroup> g;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      g = lane->group;
    }
    if (g) g->destroy();
  }
  for (const auto& lane : lanes) {
    if (!lane->thread.joinable()) continue;
    if (lane->thread.get_id() == std::this_thread::get_id()) {
      // The transport goes from inside this lane's completion callback (the callback held the
      // agent's last reference): joining would wait for itself.
      lane->orphaned = true;
      lane->thread.detach();
      continue;
    }
    lane->thread.join();
  }
}

uint64_t GroupTransport::lead(int peer, const std::string& peer_agent, uint64_t* incarnation) {
  std::lock_guard<std::mutex> lock(mutex_);
  *incarnation = incarnation_;
  if (!group_ || group_->rank() > peer) return 0;
  // Not while a reset runs: a lane made now would number from the old incarnation.
  if (!aborted_.empty()) throw Error(ErrorCode::kAborted, aborted_text_locked());
  return lane_locked(peer, peer_agent).next_assign++;
}

void GroupTransport::skip(int peer, const std::string& peer_agent, uint64_t seq,
                          uint64_t incarnation) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shut_ || !aborted_.empty() || incarnation != incarnation_) return;
    auto job = std::make_shared<GroupJob>();
    job->kind = GroupJob::Kind::kSkip;
    job->peer = peer;
    job->seq = seq;
    job->deadline = Clock::now() + std::chrono::hours(1);
    lane_locked(peer, peer_agent).waiting[seq] = job;
  }
  work_.notify_all();
}

std::shared_ptr<GroupJob> GroupTransport::make_job(GroupJob::Kind kind, int peer,
                                                   std::vector<TensorView> tensors,
                                                   Clock::time_point deadline,
                                                   std::function<void(bool)> on_done) {
  auto job = std::make_shared<GroupJob>();
  job->kind = kind;
  job->peer = peer;
  job->tensors = std::move(tensors);
  job->deadline = deadline;
  job->on_done = std::move(on_done);
  return job;
}

GroupTransport::Lane& GroupTransport::number_locked(GroupJob& job, const std::string& peer_agent,
                                                    uint64_t seq, uint64_t incarnation) {
  if (!aborted_.empty()) throw Error(ErrorCode::kAborted, aborted_text_locked());
  if (incarnation != incarnation_) {
    throw Error(ErrorCode::kAborted, "transport '" + name_ + "' of agent '" + agent_ +
                                         "': its group was reset during the transfer");
  }
  Lane& pair = lane_locked(job.peer, peer_agent);
  job.seq = seq > 0 ? seq : pair.next_assign++;
  if (job.seq < pair.next_post || pair.waiting.count(job.seq) != 0) {
    throw Error(ErrorCode::kInternal, "transport '" + name_ + "': transfer #" +
                                          std::to_string(job.seq) + " with rank " +
                                          std::to_string(job.peer) + " was queued twice");
  }
  return pair;
}

void GroupTransport::fail_waiting_locked(const std::string& why,
                                         std::vector<std::shared_ptr<GroupJob>>& done) {
  for (auto& [peer, lane] : lanes_) {
    for (auto& [seq, job] : lane->waiting) {
      if (job->finished) continue;
      job->finished = true;
      job->error = std::make_exception_ptr(Error(
          ErrorCode::kAborted, "transport '" + name_ + "' of agent '" + agent_ + "': " + why));
      done.push_back(job);
    }
    lane->waiting.clear();
  }
}

void GroupTransport::abort(const std::string& reason) noexcept {
  std::shared_ptr<CollectiveGroup> g;
  std::vector<std::shared_ptr<CollectiveGroup>> pairs;
  std::vector<std::shared_ptr<GroupJob>> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.empty()) {
      aborted_ = reason;
      TUTTI_LOG_WARN("direct transport: agent '{}' aborts the group '{}' of transport '{}': {}",
                     agent_, set_, name_, reason);
    }
    fail_waiting_locked("its group was aborted: " + aborted_, done);
    g = group_;
    for (const auto& [peer, lane] : lanes_) {
      if (lane->group) pairs.push_back(lane->group);
    }
  }
  // The pairs' groups end their batches; the transport's ends a lane's split waiting for a peer.
  for (auto& p : pairs) p->abort(reason);
  if (g) g->abort(reason);
  end_failed(done);  // last: nothing of this transport after it
}

void GroupTransport::end_failed(const std::vector<std::shared_ptr<GroupJob>>& done) {
  done_.notify_all();
  for (const auto& j : done) {
    if (j->on_done) j->on_done(false);
  }
}

std::shared_ptr<CollectiveGroup> GroupTransport::make_pair_group(
    Lane& l, const std::shared_ptr<CollectiveGroup>& base, const std::string& set, int me,
    Clock::time_point deadline) {
  if (!base) throw Error(ErrorCode::kAborted, "the transport has no group");
  const int low = std::min(me, l.peer);
  const int high = std::max(me, l.peer);
  const std::string& low_agent = me == low ? agent_id_ : l.peer_agent;
  const std::string& high_agent = me == low ? l.peer_agent : agent_id_;
  SplitOptions so;
  so.local = true;
  // Named after both ranks and both agents: agents that attach a group another pair of agents
  // used before meet under names of their own.
  so.name = set + ".pair" + std::to_string(low) + "-" + std::to_string(high) + "." +
            low_agent.substr(0, 8) + high_agent.substr(0, 8);
  so.timeout = ms_until(deadline);
  auto pair = base->split({low, high}, so);
  std::string gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    l.group = pair;
    if (l.stopping) gone = "the transport was reset, given another group, or destroyed";
    if (gone.empty() && !aborted_.empty()) gone = "the transport was aborted (" + aborted_ + ")";
  }
  // Made after an abort or a stop looked for it: nothing may run on it.
  if (!gone.empty()) {
    pair->abort(gone);
    throw Error(ErrorCode::kAborted, gone);
  }
  return pair;
}

std::vector<std::shared_ptr<GroupJob>> GroupTransport::take_ready_locked(Lane& l,
                                                                         std::string* broken) {
  std::vector<std::shared_ptr<GroupJob>> batch;
  const auto now = Clock::now();
  for (auto it = l.waiting.find(l.next_post); it != l.waiting.end();
       it = l.waiting.find(l.next_post)) {
    batch.push_back(it->second);
    l.waiting.erase(it);
    ++l.next_post;
  }
  // A number that never comes (a fetch lost on the way) holds everything behind it.
  for (const auto& [seq, job] : l.waiting) {
    if (now >= job->deadline) {
      *broken = "transfer #" + std::to_string(l.next_post) + " with rank " +
                std::to_string(l.peer) + " never came, and #" + std::to_string(seq) +
                " behind it ran past its deadline";
    }
  }
  return batch;
}

std::exception_ptr GroupTransport::run_batch_unlocked(Lane& l,
                                                      std::vector<std::shared_ptr<GroupJob>>& batch,
                                                      const Posting& at) {
  std::vector<P2POp> ops;
  Clock::time_point latest = Clock::now();
  // In the pair's group the lower rank is 0.
  const int peer_in_pair = l.peer < at.me ? 0 : 1;
  for (auto& job : batch) {
    if (job->kind == GroupJob::Kind::kSkip) continue;  // its deadline is nobody's
    latest = std::max(latest, job->deadline);
    for (const TensorView& t : job->tensors) {
      if (t.nbytes() == 0) continue;
      ops.push_back(job->kind == GroupJob::Kind::kSend ? P2POp::send(t, peer_in_pair)
                                                       : P2POp::recv(t, peer_in_pair));
    }
  }
  if (ops.empty()) return nullptr;
  try {
    std::shared_ptr<CollectiveGroup> pair = at.pair;
    if (!pair) pair = make_pair_group(l, at.base, at.set, at.me, latest);
    // The lane's thread and a caller's (a consumer's receive, an owner's send) take turns on the
    // pair's group: `busy`, under the transport's lock, gives it to one at a time.
    pair->issue_from_this_thread();
    BatchP2POptions opts;
    opts.timeout = ms_until(latest);
    auto w = pair->batch_isend_irecv(ops, opts);
    if (w) w->wait();
    return nullptr;
  } catch (const Error& e) {
    abort_for_lane(l, at.base, e.what());
    return std::make_exception_ptr(
        Error(e.code() == ErrorCode::kInvalidUsage ? ErrorCode::kAborted : e.code(),
              "transport '" + name_ + "' of agent '" + agent_ + "': " + e.what()));
  } catch (...) {
    abort_for_lane(l, at.base, "an unexpected error in a batch");
    return std::current_exception();
  }
}

GroupTransport::Posting GroupTransport::posting_locked(const Lane& l) const {
  Posting at;
  at.base = group_;
  at.pair = l.group;
  at.set = at.pair ? std::string() : set_;  // names the pair's group, once
  at.me = group_ ? group_->rank() : 0;
  return at;
}

void GroupTransport::run_lane(const std::shared_ptr<Lane>& lane) {
  Lane& l = *lane;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!l.stopping) {
    if (l.busy) {
      // A caller's thread runs the pair's next op (receive, send). A consumer's receive: this
      // thread watches its cancel, which a receive blocked in the group cannot see, and (should
      // the group's own timeout not end it) its deadline; an owner's send has neither (`watch`
      // is null).
      l.idle = 0;
      const bool cancel = l.watch != nullptr && l.watch->load();
      if (cancel || (l.watch != nullptr && Clock::now() >= l.watch_until)) {
        const std::string why =
            receiving_from(cancel ? "cancelled while" : "timed out", l.watch_for);
        l.watch = nullptr;
        std::shared_ptr<CollectiveGroup> base = std::move(l.watch_base);
        lock.unlock();
        // Not a group attached or made since (abort_for_lane looks).
        abort_for_lane(l, base, why);
        if (l.orphaned) return;  // the transport went from inside the abort (see stop_lanes)
        base.reset();            // not under the lock: it may be the group's last reference
        lock.lock();
        continue;
      }
      work_.wait_for(lock, kWatchSlice);
      continue;
    }
    std::string broken;
    std::vector<std::shared_ptr<GroupJob>> batch = take_ready_locked(l, &broken);
    if (batch.empty() && broken.empty()) {
      // A consumer's thread that takes the lane does not wake this one (that would cost the
      // receive a hand-off it saves) unless it dozes: a slice bounds how late it starts watching.
      // Past kWatchfulSlices idle ones it dozes, in longer slices, and is woken.
      l.dozing = l.idle >= kWatchfulSlices;
      if (!l.dozing) ++l.idle;
      work_.wait_for(lock, l.dozing ? kDozeSlice : kWatchSlice);
      l.dozing = false;
      continue;
    }
    l.idle = 0;
    if (!broken.empty() && batch.empty()) {
      lock.unlock();
      abort(broken);
      if (l.orphaned) return;  // the transport went from inside the abort (see stop_lanes)
      lock.lock();
      continue;
    }
    for (auto& job : batch) job->posted = true;
    const Posting at = posting_locked(l);
    l.busy = true;
    lock.unlock();
    std::exception_ptr error = run_batch_unlocked(l, batch, at);
    for (auto& job : batch) {
      if (job->on_done) job->on_done(!error);
    }
    if (l.orphaned) return;  // the transport is gone (see stop_lanes)
    lock.lock();
    l.busy = false;
    for (auto& job : batch) {
      job->finished = true;
      job->error = error;
    }
    done_.notify_all();
  }
  // Told to stop: a group made after stop_lanes looked is this thread's to end.
  std::shared_ptr<CollectiveGroup> pair = l.group;
  lock.unlock();
  if (pair) pair->destroy();
}

}  // namespace tutti::detail
