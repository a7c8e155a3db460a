// The two-sided tensor transports ("gloo", "nccl"): the owner sends, the consumer receives, over
// groups that only this transport uses (internal to the direct transport).
//
// The transport's group (join_group's, or the application's from attach_group) carries no
// transfers itself: for each member this agent transfers with, a "lane" splits a group of the
// two off it (a local split, made by the lane's own thread on the pair's first transfer) and
// issues every op of the pair on it, as batches (batch_isend_irecv) of whatever is ready; an op
// that is the pair's next while the lane is idle runs on its caller's thread instead (two thread
// hand-offs fewer): a consumer's receive on the get's thread, the lane's thread watching its
// cancel, and an owner's CPU send on the thread that serves the consumer's connection, after its
// reply (AnswerRequest::then). The
// messages between two agents follow one order, which the lower-ranked of the two assigns (the
// "pair sequence"): its own fetches get a number before they are sent, the other's when it
// grants them. Both sides post a pair's transfers in that order, so the k-th message of one
// side meets the k-th of the other, and two agents that fetch from each other at once cannot
// wait on each other. Pairs never wait on each other either: a lane blocked on one peer leaves
// the others going, so a ring of agents each fetching from the next cannot close a cycle (with
// one thread for all pairs, each owner's send waited for a consumer whose receive was queued
// behind its own send). A transfer that fails, times out or is cancelled once the other side
// may have seen it leaves its pair out of step: the transport is aborted (its groups only:
// other transports go on), and later gets fail with kAborted quoting the first failure until
// reset() (collective: every member resets).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transfer/channel.h"
#include "tutti/collective_group.h"
#include "tutti/options.h"
#include "tutti/tensor_transport.h"

namespace tutti::detail {

// A two-sided transport over a group of the collective backend `name` ("gloo", or "nccl" for
// CUDA tensors): what those backends' libraries register (TransportInfo) when they load.
TUTTI_API std::unique_ptr<TensorTransport> make_group_transport(const std::string& name, bool cuda,
                                                                const TransportContext& ctx);

// One transfer queued for the group's thread.
struct GroupJob {
  enum class Kind { kSend, kRecv, kSkip };
  Kind kind = Kind::kSend;
  int peer = 0;
  uint64_t seq = 0;
  std::vector<TensorView> tensors;
  Clock::time_point deadline;
  std::function<void(bool ok)> on_done;  // the owner's hold ends (called once, no lock held)
  bool posted = false;
  bool finished = false;
  std::exception_ptr error;
};

// What a ref of a two-sided transport carries in its blob.
struct GroupPlace {
  std::string set;  // the group set ("rdt.gloo" or a user group's name)
  int world = 0;
  int owner_rank = 0;
};

class GroupTransport final : public TensorTransport {
 public:
  // `agent_id`: this agent's id (uuid text); a pair's group is named after both agents' ids.
  GroupTransport(std::string name, bool cuda, std::string agent_name, std::string agent_id);
  ~GroupTransport() override;
  // The agent stops: waiting transfers fail, the lanes end (joined: their pairs' groups are
  // gone on return), the agent's own group is destroyed. Idempotent; also the destructor's work.
  void shutdown() noexcept;

  const char* name() const override { return name_.c_str(); }
  TransportTraits traits() const override;
  Publication publish(const PublishRequest& request) override;
  // The consumer's half of a fetch, and the owner's (two_sided.cc): the consumer numbers the
  // transfer when it leads the pair and asks the owner (TransportPeer::call_with); the owner
  // holds the object (TransportOwner), queues its send (or leaves it to its serving thread:
  // send) and grants the number; the consumer queues the matching receive and waits.
  FetchResult fetch(const FetchRequest& request) override;
  std::string answer_with(const AnswerRequest& request) override;
  // Direct for a member of the ref's group (kAborted while the group is aborted); else not,
  // naming the group (kInvalidUsage).
  Reach reach(const TensorRef& ref, const AgentIdentity& me) const override;
  void stop() noexcept override { shutdown(); }

  // The group. `remake(incarnation)` re-creates it for reset(); null for a user's group.
  void attach(std::shared_ptr<CollectiveGroup> group, std::string set,
              std::function<std::shared_ptr<CollectiveGroup>(uint64_t)> remake);
  // Destroys the group and makes the next incarnation (collective). kInvalidUsage without one.
  void reset();
  std::shared_ptr<CollectiveGroup> group() const;
  bool has_group() const;

  static GroupPlace parse_place(const TensorRef& ref);
  // Consumer, before any I/O: the owner's rank. kInvalidUsage when this agent is not a member of
  // the ref's group, kAborted once the group was aborted.
  int check_member(const TensorRef& ref, bool* member) const;
  // Owner, for a consumer's fetch: kInvalidUsage unless it names this group and a valid rank.
  // Waits (until `deadline`) for a reset in progress here to finish.
  void check_peer(const std::string& set, uint64_t incarnation, int rank,
                  Clock::time_point deadline);
  std::string set() const;
  uint64_t incarnation() const;
  int rank() const;

  // The peer is rank `peer` of the group, agent `peer_agent` (its id, uuid text).
  // The pair's next sequence number when this rank assigns the pair's order, else 0.
  // `incarnation` receives the group's incarnation the number belongs to. kAborted while the
  // transport is aborted or being reset.
  uint64_t lead(int peer, const std::string& peer_agent, uint64_t* incarnation);
  // A number the other side assigned and then gave up (the fetch was refused).
  void skip(int peer, const std::string& peer_agent, uint64_t seq, uint64_t incarnation);
  // Owner: queues a send as number `seq` of the pair (0: the next, this rank leads the pair) of
  // the group's `incarnation`, and returns its number; throws kAborted once the group is aborted
  // or was reset since. `on_done` ends the owner's hold (called once, no lock held). With `then`
  // (AnswerRequest::then), a send that is the pair's next transfer while the lane is idle is left
  // in it for the answering thread to run after its reply, instead of to the lane's thread.
  uint64_t send(int peer, const std::string& peer_agent, uint64_t seq, uint64_t incarnation,
                std::vector<TensorView> tensors, Clock::time_point deadline,
                std::function<void(bool)> on_done, std::function<void()>* then);
  // Consumer: queues a receive as `send` does and waits for it as `wait` does; when it is the
  // pair's next transfer and the lane is idle, this thread runs it (saving the lane's two thread
  // hand-offs) while the lane's thread watches its cancel.
  void receive(int peer, const std::string& peer_agent, uint64_t seq, uint64_t incarnation,
               std::vector<TensorView> targets, Clock::time_point deadline,
               const std::atomic<bool>& cancelled, const std::string& waiting_for);
  // Aborts the group (idempotent: the first reason stays).
  void abort(const std::string& reason) noexcept;

 private:
  // The transfers with one peer, and the thread and group that carry them.
  struct Lane {
    Lane(int p, std::string a) : peer(p), peer_agent(std::move(a)) {}
    const int peer;
    const std::string peer_agent;  // its id (uuid text)
    uint64_t next_post = 1;        // the next number this side posts
    uint64_t next_assign = 1;      // the next number to assign (the leader's)
    std::map<uint64_t, std::shared_ptr<GroupJob>> waiting;
    std::shared_ptr<CollectiveGroup> group;  // the pair's, made on its first transfer
    bool busy = false;  // making the pair's group or running a batch on it (this thread, a
                        // consumer's running its receive, or an owner's serving thread its send)
    // While a consumer's thread runs the receive: its cancel, which the lane's thread watches
    // (and nulls once it aborted the transport for it), the peer as its errors name it, and when
    // the lane gives up on it should the group's own timeout not end it.
    const std::atomic<bool>* watch = nullptr;
    std::string watch_for;
    Clock::time_point watch_until;
    std::shared_ptr<CollectiveGroup> watch_base;  // the transport's group the receive is on
    int idle = 0;                                 // the lane thread's looks since it last had work
    bool dozing = false;    // it waits in longer slices: a consumer that takes the lane wakes it
    bool stopping = false;  // reset, replaced or going: the thread ends
    // The transport went from this lane's own thread (a send's completion callback, called by
    // the lane or by an abort it started, dropped the agent's last reference): the thread was
    // detached and must not touch the transport again.
    bool orphaned = false;
    std::thread thread;
  };

  Lane& lane_locked(int peer, const std::string& peer_agent);
  // Aborts the transport for a lane's failure, unless the lane was told to stop or the transport
  // has moved on to another group since `base` (a reset or an attach: not that group's failure).
  void abort_for_lane(const Lane& lane, const std::shared_ptr<CollectiveGroup>& base,
                      const std::string& reason);
  void run_lane(const std::shared_ptr<Lane>& lane);
  // What a batch needs from the transport, read under the lock.
  struct Posting {
    std::shared_ptr<CollectiveGroup> base;  // the transport's group
    std::shared_ptr<CollectiveGroup> pair;  // the pair's, null before its first transfer
    std::string set;                        // names the pair's group when it is made
    int me = 0;
  };
  Posting posting_locked(const Lane& l) const;
  // The pair's next numbers that are queued, in order, out of the lane; `broken` says so when a
  // number that never came holds back one past its deadline.
  std::vector<std::shared_ptr<GroupJob>> take_ready_locked(Lane& l, std::string* broken);
  // Posts a batch on the pair's group (made first, when it has none) and waits for it; its
  // error, after aborting the transport for it.
  std::exception_ptr run_batch_unlocked(Lane& l, std::vector<std::shared_ptr<GroupJob>>& batch,
                                        const Posting& at);
  // How often a waiting consumer (wait) or a lane's thread (watching a receive a consumer's
  // thread runs) looks at a cancel.
  static constexpr std::chrono::milliseconds kWatchSlice{20};
  // receive's queued path: waits for the lane to run the receive. At the deadline or on cancel it
  // aborts the group, waits (a bounded time) until the receive no longer touches the targets,
  // and throws kTimeout / kAborted; the batch's own error otherwise.
  void wait(GroupJob& job, Clock::time_point deadline, const std::atomic<bool>& cancelled,
            const std::string& waiting_for);
  // Whether numbered `job` may run on the caller's thread: the pair's next transfer, nothing
  // queued, on an idle lane that has its group.
  static bool can_run_here_locked(const Lane& l, const GroupJob& job);
  // Takes the lane for the caller's thread to run `job` (after can_run_here_locked): what the
  // batch needs.
  Posting claim_locked(Lane& l, GroupJob& job);
  // Runs `job` on the lane the caller's thread claimed and gives the lane back, however the batch
  // ends; its error. `watched` (a receive's): the lane's thread aborted the transport for it.
  std::exception_ptr run_here(Lane& l, const std::shared_ptr<GroupJob>& job, const Posting& at,
                              bool* watched);
  // The receive a consumer's thread took from its lane (receive), run.
  void receive_here(Lane& l, const std::shared_ptr<GroupJob>& job, const Posting& at,
                    const std::atomic<bool>& cancelled, const std::string& waiting_for);
  // "<what> receiving from <peer>": why a receive's transport is aborted.
  static std::string receiving_from(const char* what, const std::string& waiting_for);
  // That, "over transport ... call reset_transport ...": the error the get throws.
  std::string receive_failed_text(const char* what, const std::string& waiting_for,
                                  const std::string& set) const;
  static std::shared_ptr<GroupJob> make_job(GroupJob::Kind kind, int peer,
                                            std::vector<TensorView> tensors,
                                            Clock::time_point deadline,
                                            std::function<void(bool)> on_done);
  // The job's number in its pair (`seq`, or the next when 0), checked; its lane.
  Lane& number_locked(GroupJob& job, const std::string& peer_agent, uint64_t seq,
                      uint64_t incarnation);
  // The pair's group, split off `base` (a local split: only the two meet) on the pair's first
  // transfer, within `deadline`; kAborted when the lane was stopped or the transport aborted
  // meanwhile (the group is then aborted at once).
  std::shared_ptr<CollectiveGroup> make_pair_group(Lane& lane,
                                                   const std::shared_ptr<CollectiveGroup>& base,
                                                   const std::string& set, int me,
                                                   Clock::time_point deadline);
  // The lanes out of the transport, told to stop; join them with stop_lanes (no lock held).
  std::vector<std::shared_ptr<Lane>> take_lanes_locked();
  void stop_lanes(const std::vector<std::shared_ptr<Lane>>& lanes);
  void fail_waiting_locked(const std::string& why, std::vector<std::shared_ptr<GroupJob>>& done);
  // After fail_waiting_locked, without the lock: wakes the jobs' waiters, then runs the owners'
  // completion callbacks, last (a callback may drop the agent's last reference, and with it this
  // transport: see Lane::orphaned).
  void end_failed(const std::vector<std::shared_ptr<GroupJob>>& done);
  std::string aborted_text_locked() const;

  const std::string name_;
  const bool cuda_;
  const std::string agent_;
  const std::string agent_id_;

  mutable std::mutex mutex_;
  std::condition_variable work_;  // a job was queued, or a lane was told to stop
  std::condition_variable done_;  // a job finished
  std::shared_ptr<CollectiveGroup> group_;
  std::function<std::shared_ptr<CollectiveGroup>(uint64_t)> remake_;
  std::string set_;
  uint64_t incarnation_ = 0;
  std::string aborted_;  // the first failure; empty while usable
  bool resetting_ = false;
  std::map<int, std::shared_ptr<Lane>> lanes_;  // by peer rank
  bool shut_ = false;                           // shutdown() ran
};

}  // namespace tutti::detail
