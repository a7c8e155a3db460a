// The two-sided transports' lanes (group_transport.h): a pair's order of transfers, its queue,
// the thread and the two-rank group that carry them, and what a failure does to them.
#include <algorithm>

#include "transfer/group_transport.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// How long an aborted receive may take to give its targets back before the get returns anyway.
constexpr std::chrono::seconds kDrain{5};

std::chrono::milliseconds ms_until(Clock::time_point t) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()));
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

std::shared_ptr<GroupJob> GroupTransport::enqueue(GroupJob::Kind kind, int peer,
                                                  const std::string& peer_agent, uint64_t seq,
                                                  uint64_t incarnation,
                                                  std::vector<TensorView> tensors,
                                                  Clock::time_point deadline,
                                                  std::function<void(bool)> on_done) {
  auto job = std::make_shared<GroupJob>();
  job->kind = kind;
  job->peer = peer;
  job->tensors = std::move(tensors);
  job->deadline = deadline;
  job->on_done = std::move(on_done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) throw Error(ErrorCode::kAborted, aborted_text_locked());
    if (incarnation != incarnation_) {
      throw Error(ErrorCode::kAborted, "transport '" + name_ + "' of agent '" + agent_ +
                                           "': its group was reset during the transfer");
    }
    Lane& pair = lane_locked(peer, peer_agent);
    job->seq = seq > 0 ? seq : pair.next_assign++;
    if (job->seq < pair.next_post || pair.waiting.count(job->seq) != 0) {
      throw Error(ErrorCode::kInternal, "transport '" + name_ + "': transfer #" +
                                            std::to_string(job->seq) + " with rank " +
                                            std::to_string(peer) + " was queued twice");
    }
    pair.waiting[job->seq] = job;
  }
  work_.notify_all();
  return job;
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

void GroupTransport::wait(GroupJob& job, Clock::time_point deadline,
                          const std::atomic<bool>& cancelled, const std::string& waiting_for) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::string why;
  ErrorCode code = ErrorCode::kTimeout;
  while (!job.finished) {
    if (cancelled.load()) {
      why = "cancelled while receiving from " + waiting_for;
      code = ErrorCode::kAborted;
      break;
    }
    if (Clock::now() >= deadline) {
      why = "timed out receiving from " + waiting_for;
      break;
    }
    done_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(20)));
  }
  if (job.finished) {
    if (job.error) std::rethrow_exception(job.error);
    return;
  }
  lock.unlock();
  abort(why);
  lock.lock();
  // The receive may be writing the targets: wait until the aborted batch let go of them.
  done_.wait_until(lock, Clock::now() + kDrain, [&] { return job.finished; });
  if (!job.finished) {
    TUTTI_LOG_WARN(
        "direct transport: agent '{}': the aborted receive from {} did not end within "
        "{} s; its targets may still change",
        agent_, waiting_for, kDrain.count());
  }
  throw Error(code, why + " over transport '" + name_ + "' (its group '" + set_ +
                        "' is aborted: call reset_transport('" + name_ + "') on every member)");
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

void GroupTransport::run_lane(const std::shared_ptr<Lane>& lane) {
  Lane& l = *lane;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!l.stopping) {
    // What is ready: the pair's next numbers, in order.
    std::vector<std::shared_ptr<GroupJob>> batch;
    std::string broken;
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
        broken = "transfer #" + std::to_string(l.next_post) + " with rank " +
                 std::to_string(l.peer) + " never came, and #" + std::to_string(seq) +
                 " behind it ran past its deadline";
      }
    }
    if (batch.empty() && broken.empty()) {
      work_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    if (!broken.empty() && batch.empty()) {
      lock.unlock();
      abort(broken);
      if (l.orphaned) return;  // the transport went from inside the abort (see stop_lanes)
      lock.lock();
      continue;
    }
    std::vector<P2POp> ops;
    Clock::time_point latest = now;
    // In the pair's group the lower rank is 0.
    const int me = group_ ? group_->rank() : 0;
    const int peer_in_pair = l.peer < me ? 0 : 1;
    for (auto& job : batch) {
      job->posted = true;
      if (job->kind == GroupJob::Kind::kSkip) continue;  // its deadline is nobody's
      latest = std::max(latest, job->deadline);
      for (const TensorView& t : job->tensors) {
        if (t.nbytes() == 0) continue;
        ops.push_back(job->kind == GroupJob::Kind::kSend ? P2POp::send(t, peer_in_pair)
                                                         : P2POp::recv(t, peer_in_pair));
      }
    }
    std::shared_ptr<CollectiveGroup> base = group_;
    std::shared_ptr<CollectiveGroup> pair = l.group;
    const std::string set = pair ? std::string() : set_;  // names the pair's group, once
    l.busy = true;
    lock.unlock();
    std::exception_ptr error;
    if (!ops.empty()) {
      try {
        if (!pair) pair = make_pair_group(l, base, set, me, latest);
        BatchP2POptions opts;
        opts.timeout = ms_until(latest);
        auto w = pair->batch_isend_irecv(ops, opts);
        if (w) w->wait();
      } catch (const Error& e) {
        error = std::make_exception_ptr(
            Error(e.code() == ErrorCode::kInvalidUsage ? ErrorCode::kAborted : e.code(),
                  "transport '" + name_ + "' of agent '" + agent_ + "': " + e.what()));
        abort_for_lane(l, base, e.what());
      } catch (...) {
        error = std::current_exception();
        abort_for_lane(l, base, "an unexpected error in a batch");
      }
    }
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
