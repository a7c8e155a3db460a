// CollectiveGroup's private state, and the checks every op runs before any I/O (internal).
#pragma once

#include <array>
#include <atomic>
#include <bitset>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "group/flight_recorder.h"
#include "group/group_util.h"
#include "group/op_queue.h"
#include "group/op_tags.h"
#include "tutti/backend.h"
#include "tutti/collective_group.h"
#include "tutti/error.h"
#include "tutti/store.h"
#include "util/fork_watch.h"

namespace tutti {

namespace detail {
// Waits (at most their linger) for the TCP stores that ranks of destroyed groups host and keep
// serving for the group's slower ranks: the exit hooks call it.
void wait_for_lingering_stores();
}  // namespace detail

struct CollectiveGroup::State {
  // Who this group is; fixed at creation.
  std::shared_ptr<const std::string> name;
  int rank = 0;
  int world_size = 1;
  std::string backend_name;
  std::chrono::milliseconds timeout{30000};
  std::vector<int> global_ranks;
  std::vector<std::string> hosts;
  std::vector<long> pids;
  // Each rank's process start time, where its pid names it here (one host and pid namespace;
  // else 0: unknown).
  std::vector<uint64_t> starts;

  std::shared_ptr<Store> store;  // the store the group met through
  std::string scope;             // this incarnation's key prefix in store
  std::string root_scope;        // the root group's scope (where ranks' departures are noted)
  // `store`, noting the keys this incarnation writes (backends, subgroups) so that they can be
  // deleted later (see store/ledger_store.h); a subgroup notes into its root group's.
  std::shared_ptr<Store> ledger;
  std::string base;           // a root group's key prefix over all its incarnations
  std::string admit_key;      // where grow() invites new processes (its root's base + /admit)
  std::string ledger_prefix;  // where `ledger` notes keys (its root's incarnation's)
  int64_t incarnation = 0;
  bool owns_store = false;  // opened from a URL by this group
  // A root group's store the caller gave (GroupOptions::store), or that of the root group it
  // was shrunk or grown from: its host lingers at destroy as for an owned one.
  bool caller_store = false;
  std::string instance;     // names OS resources (see BackendContext)
  std::string join_record;  // this rank's claim in the store (given back at destroy)

  // What the backend supports, read once at creation so validation never touches it.
  std::array<bool, 2> device_supported{};  // by DeviceType
  std::bitset<kOpTypeCount> op_supported;
  int max_devices = 1;
  bool runs_inline = true;

  // The process that created the group (see fork_watch.h): in a forked child the group is
  // the parent's, and refused.
  uint64_t fork_generation = detail::fork_generation();
  long creator_pid = 0;
  bool forked() const { return fork_generation != detail::fork_generation(); }

  // The thread that issues the group's ops (see collective_group.h, "Threads"): a token that
  // expires when that thread ends, and its serial number for the fast path.
  std::mutex owner_mutex;
  std::weak_ptr<const void> owner;
  std::atomic<uint64_t> owner_serial{0};
  bool check_ops = false;  // compare fingerprints before each collective (op_check.h)
  std::shared_ptr<detail::FlightRecorder> recorder;  // null when turned off

  std::atomic<bool> destroyed{false};
  std::atomic<bool> aborted{false};
  mutable std::mutex state_mutex;  // guards abort_reason and the backend pointer
  std::string abort_reason;        // non-empty once aborted
  std::shared_ptr<Backend> backend;
  std::set<std::string> local_splits;  // the names of the local splits made (SplitOptions::local)

  // This group's symmetric allocations that every rank attached (allocate_symmetric), for
  // is_symmetric; expired ones are dropped at the next allocation.
  mutable std::mutex symmetric_mutex;
  std::vector<std::weak_ptr<SymmetricMemory>> symmetric_memory;

  // Issuing: seq numbers, inline ops, pushes to the queue.
  std::mutex op_mutex;
  // The last signature hashed for a tag and its hash (a loop repeats one op): under op_mutex.
  OpSignature hashed_signature;
  uint64_t signature_hash = OpSignature{}.hash();
  uint64_t collective_seq = 0;
  uint64_t batch_seq = 0;
  uint64_t split_count = 0;
  uint64_t shrink_count = 0;
  uint64_t grow_count = 0;
  std::map<int, uint64_t> send_seq;  // per destination rank
  std::map<int, uint64_t> recv_seq;  // per source rank
  std::atomic<int> queued{0};        // async ops pushed and not yet finished
  detail::OpQueue queue;

  std::string describe() const;
  std::shared_ptr<Backend> current_backend() const;
  // Marks the group aborted (the first reason stays) and tells the backend. From any thread.
  void abort(const std::string& reason);
  // Throws kAborted "<what>: the group was aborted (<reason>)" once it was.
  void throw_if_aborted(const std::string& what) const;
  // An op's failure: aborts the group for the codes that leave it in an unknown state.
  void record_failure(const OpContext& ctx, const Error& e);
  // Waits until the ops queued so far have run (hooks_too: and their Works' hooks), unless on
  // the worker or destroyed; see group_ops.cc.
  void drain(bool hooks_too = false);

  // The checks (validation.cc). Each throws Error naming op, group and value.
  [[noreturn]] void fail(ErrorCode code, OpType op, const std::string& what) const;
  void check_usable(OpType op) const;
  // Fails unless the calling thread issues this group's ops (taking them over when the thread
  // that did has ended).
  void check_thread(OpType op);
  // Makes the calling thread the one that issues this group's ops.
  void take_thread();
  std::string forked_message() const;
  void check_tensor(OpType op, const TensorView& t, const char* what) const;
  void check_rank(OpType op, int value, const char* what, bool allow_self = true) const;
  void check_reduce_op(OpType op, ReduceOp reduce_op, DType dtype) const;
  void check_like(OpType op, const TensorView& t, const TensorView& ref, const std::string& what,
                  const char* ref_name) const;
  // A list of one tensor per rank ("output list"), each ("output 3") like ref.
  void check_list(OpType op, const std::vector<TensorView>& list, const TensorView& ref,
                  const char* item_name, const char* ref_name) const;
  void check_same_dtype(OpType op, const TensorView& a, const char* a_name, const TensorView& b,
                        const char* b_name) const;
  void check_counts(OpType op, const std::vector<int64_t>& counts, const char* what, int64_t total,
                    const char* total_name) const;
  void check_device_list(OpType op, const std::vector<TensorView>& tensors, const char* what) const;
  void check_rooted_list(OpType op, const std::vector<TensorView>& tensors, int root_rank,
                         int root_tensor) const;
  void check_lists(OpType op, const std::vector<std::vector<TensorView>>& lists,
                   const std::vector<TensorView>& refs, size_t count, const char* list_name,
                   const char* ref_name) const;
  void check_disjoint(OpType op, const TensorView& a, const char* a_name, const TensorView& b,
                      const char* b_name) const;
  // A list form's one tensor against its list (allgather's input and outputs, reduce_scatter's
  // output and inputs): list[own] (default: this rank's entry) may be `one` itself (in place);
  // every other overlap is refused, naming the list's tensor.
  void check_list_apart(OpType op, const std::vector<TensorView>& list, const char* item_name,
                        const TensorView& one, const char* one_name, int own = -1) const;
  // The same for each device's list of the multi-device forms (this rank's entry on device d:
  // rank x devices + d).
  void check_lists_apart(OpType op, const std::vector<std::vector<TensorView>>& lists,
                         const char* list_name, const std::vector<TensorView>& ones,
                         const char* one_name) const;
  // alltoall's lists: output q and input q may be one tensor for this rank's q (in place); any
  // other output that overlaps an input is refused, naming both.
  void check_lists_disjoint(OpType op, const std::vector<TensorView>& outs,
                            const std::vector<TensorView>& ins) const;
  TensorView check_p2p_multigpu(OpType op, const TensorView& tensor, int peer, int64_t n_elements,
                                int peer_device) const;
};

}  // namespace tutti
