#include "transfer/group_transport.h"

#include <algorithm>

#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {

std::unique_ptr<TensorTransport> make_group_transport(const std::string& name, bool cuda,
                                                      const TransportContext& ctx) {
  return std::make_unique<GroupTransport>(name, cuda, ctx.agent.name, ctx.agent.uuid_text());
}

GroupTransport::GroupTransport(std::string name, bool cuda, std::string agent_name,
                               std::string agent_id)
    : name_(std::move(name)),
      cuda_(cuda),
      agent_(std::move(agent_name)),
      agent_id_(std::move(agent_id)) {}

GroupTransport::~GroupTransport() {
  shutdown();
}

void GroupTransport::shutdown() noexcept {
  std::shared_ptr<CollectiveGroup> g;
  bool own = false;
  bool busy = false;
  std::vector<std::shared_ptr<Lane>> lanes;
  std::vector<std::shared_ptr<GroupJob>> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shut_) return;
    shut_ = true;
    g = group_;
    own = remake_ != nullptr;
    // A lane busy splitting its pair's group (it has none yet), not one running a transfer.
    for (const auto& [peer, lane] : lanes_) busy = busy || (lane->busy && !lane->group);
    fail_waiting_locked("the agent is going", done);
    lanes = take_lanes_locked();
  }
  end_failed(done);
  // The agent's own group goes; the application's is aborted only when a lane may be splitting
  // a pair off it (that ends the split's wait for the peer).
  if (g && own) {
    g->destroy();
  } else if (g && busy) {
    g->abort("the transfer agent '" + agent_ + "' is going");
  }
  stop_lanes(lanes);
}

TransportTraits GroupTransport::traits() const {
  TransportTraits t;
  t.one_sided = false;
  t.can_borrow = false;
  t.cross_host = true;
  t.cuda = cuda_;
  t.holds_itself = true;  // the owner's answer holds it for the send (TransportOwner::hold)
  return t;
}

void GroupTransport::attach(std::shared_ptr<CollectiveGroup> group, std::string set,
                            std::function<std::shared_ptr<CollectiveGroup>(uint64_t)> remake) {
  std::shared_ptr<CollectiveGroup> old;
  std::vector<std::shared_ptr<GroupJob>> done;
  std::vector<std::shared_ptr<Lane>> lanes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    old = std::move(group_);
    fail_waiting_locked("the group was replaced", done);
    lanes = take_lanes_locked();
    group_ = std::move(group);
    set_ = std::move(set);
    remake_ = std::move(remake);
    aborted_.clear();
    ++incarnation_;
  }
  end_failed(done);
  if (old) old->abort("replaced by another group");
  stop_lanes(lanes);
}

void GroupTransport::reset() {
  std::shared_ptr<CollectiveGroup> old;
  std::function<std::shared_ptr<CollectiveGroup>(uint64_t)> remake;
  uint64_t next;
  std::vector<std::shared_ptr<GroupJob>> done;
  std::vector<std::shared_ptr<Lane>> lanes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!group_) {
      throw Error(ErrorCode::kInvalidUsage, "reset_transport on agent '" + agent_ +
                                                "': transport '" + name_ + "' has no group");
    }
    if (!remake_) {
      throw Error(ErrorCode::kInvalidUsage,
                  "reset_transport on agent '" + agent_ + "': the group of transport '" + name_ +
                      "' is the application's (attach_group): attach a new one instead");
    }
    old = group_;
    remake = remake_;
    next = incarnation_ + 1;
    if (aborted_.empty()) aborted_ = "being reset";
    resetting_ = true;
    fail_waiting_locked("the group is being reset", done);
    lanes = take_lanes_locked();
  }
  end_failed(done);
  old->destroy();  // first: it ends a lane's split waiting for its peer
  stop_lanes(lanes);
  std::shared_ptr<CollectiveGroup> fresh;
  try {
    fresh = remake(next);  // collective: every member resets
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    resetting_ = false;
    done_.notify_all();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    group_ = std::move(fresh);
    incarnation_ = next;
    aborted_.clear();
    resetting_ = false;
  }
  work_.notify_all();
  done_.notify_all();
}

std::shared_ptr<CollectiveGroup> GroupTransport::group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return group_;
}

bool GroupTransport::has_group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return group_ != nullptr;
}

std::string GroupTransport::set() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return set_;
}

uint64_t GroupTransport::incarnation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return incarnation_;
}

int GroupTransport::rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return group_ ? group_->rank() : -1;
}

Publication GroupTransport::publish(const PublishRequest&) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!group_) {
    throw Error(ErrorCode::kInvalidUsage,
                "transport '" + name_ + "' is two-sided and agent '" + agent_ +
                    "' has no group for it: call TransferAgent::join_group or attach_group first");
  }
  WireWriter w;
  w.str8(set_);
  w.u32(static_cast<uint32_t>(group_->world_size()));
  w.u32(static_cast<uint32_t>(group_->rank()));
  Publication p;
  p.blob = std::move(w.out());
  return p;
}

GroupPlace GroupTransport::parse_place(const TensorRef& ref) {
  WireReader r(ref.blob(), "the two-sided transport bytes of " + ref.describe());
  GroupPlace p;
  p.set = r.str8("group set");
  p.world = static_cast<int>(r.u32("world size"));
  p.owner_rank = static_cast<int>(r.u32("owner rank"));
  r.finish();
  if (p.world <= 1 || p.owner_rank < 0 || p.owner_rank >= p.world) {
    r.fail("owner rank " + std::to_string(p.owner_rank) + " of world " + std::to_string(p.world));
  }
  return p;
}

int GroupTransport::check_member(const TensorRef& ref, bool* member) const {
  const GroupPlace p = parse_place(ref);
  std::lock_guard<std::mutex> lock(mutex_);
  const bool in =
      group_ && set_ == p.set && group_->world_size() == p.world && group_->rank() != p.owner_rank;
  if (member != nullptr) *member = in;
  if (!in) {
    if (member != nullptr) return p.owner_rank;
    std::string here = group_ ? "this agent is rank " + std::to_string(group_->rank()) + " of '" +
                                    set_ + "' (world " + std::to_string(group_->world_size()) + ")"
                              : "this agent has no group for '" + name_ + "'";
    throw Error(ErrorCode::kInvalidUsage,
                "the object is sent two-sided over group '" + p.set + "' (owner rank " +
                    std::to_string(p.owner_rank) + " of " + std::to_string(p.world) + "); " + here +
                    ": join or attach that group, republish with 'shm' or 'socket', or pass "
                    "GetOptions::allow_fallback");
  }
  if (!aborted_.empty()) throw Error(ErrorCode::kAborted, aborted_text_locked());
  return p.owner_rank;
}

void GroupTransport::check_peer(const std::string& set, uint64_t incarnation, int rank,
                                Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  // A consumer that finished its part of a reset may ask before this side has.
  done_.wait_until(lock, deadline, [&] { return !resetting_; });
  if (!group_ || set != set_ || rank < 0 || rank >= group_->world_size() ||
      rank == group_->rank()) {
    throw Error(ErrorCode::kInvalidUsage,
                "the consumer claims rank " + std::to_string(rank) + " of group '" + set +
                    "', the owner is " +
                    (group_ ? "rank " + std::to_string(group_->rank()) + " of '" + set_ + "'"
                            : std::string("in no group")));
  }
  if (!aborted_.empty()) throw Error(ErrorCode::kAborted, aborted_text_locked());
  if (incarnation != incarnation_) {
    throw Error(ErrorCode::kAborted, "the owner's group '" + set_ + "' is at incarnation " +
                                         std::to_string(incarnation_) + ", the consumer's at " +
                                         std::to_string(incarnation) +
                                         ": every member must reset_transport('" + name_ + "')");
  }
}

std::string GroupTransport::aborted_text_locked() const {
  return "transport '" + name_ + "' of agent '" + agent_ + "': its group '" + set_ +
         "' was aborted (" + aborted_ + "); call reset_transport('" + name_ + "') on every member";
}

}  // namespace tutti::detail
