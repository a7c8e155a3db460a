// CollectiveGroup: a set of ranks that run collectives together through one backend.
//
// The group owns its name, rank, world size and default timeout, validates every call before
// any I/O (each failure a tutti::Error naming group, rank, op and the offending value), and
// dispatches to its backend.
//
// Threads: every method is safe to call from several threads. Ops on one group are serialised
// in the order they arrive; as with any collective library, every rank must issue a group's ops
// in the same order, so concurrent callers must agree on an order among themselves (ranks that
// disagree get mismatched ops, which time out naming the op, rather than wrong data).
// Several groups run independently, side by side.
//
// Failure: kInvalidArgument / kInvalidUsage errors leave the group usable. A timeout, transport
// error or disagreement between ranks aborts the group: later ops fail with kAborted until it is
// destroyed and initialised again. See docs/errors.md.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/backend.h"
#include "tutti/error.h"
#include "tutti/export.h"
#include "tutti/options.h"
#include "tutti/tensor_view.h"

namespace tutti {

class Store;

class TUTTI_API CollectiveGroup {
 public:
  // Joins a group: validates the arguments, meets the other ranks through the store (see
  // GroupOptions) and creates the backend. Throws Error(kInvalidArgument) for bad values,
  // kUnavailable for an unknown backend, kTimeout naming the missing ranks.
  // The process-wide registry of named groups (init_collective_group) is built on this; ranks
  // that are threads of one process create their groups here directly.
  static std::shared_ptr<CollectiveGroup> create(int world_size, int rank,
                                                 std::string_view backend,
                                                 std::string_view group_name,
                                                 const GroupOptions& options = {});
  ~CollectiveGroup();

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend_name() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool is_destroyed() const { return destroyed_.load(); }
  bool is_aborted() const;

  // Tears down the backend. Local: it never waits for other ranks and never throws. (The one
  // exception: a rank that hosts the group's TCP store keeps serving until the other ranks have
  // left, at most 10 s, so that a fast rank 0 does not break slower ranks' teardown.) Later
  // calls fail with kInvalidUsage. Idempotent.
  void destroy() noexcept;

  void broadcast(TensorView tensor, const BroadcastOptions& opts = {});
  void allreduce(TensorView tensor, const AllreduceOptions& opts = {});
  // Only the root's tensor changes.
  void reduce(TensorView tensor, const ReduceOptions& opts = {});
  // output_list[r] receives rank r's input; world_size entries, each shaped like the input.
  void allgather(const std::vector<TensorView>& output_list, TensorView input,
                 const AllgatherOptions& opts = {});
  // The single-buffer form: output holds the world's inputs back to back (world_size x numel).
  void allgather(TensorView output, TensorView input, const AllgatherOptions& opts = {});
  // output = reduction over ranks of input_list[rank]; world_size entries shaped like output.
  void reduce_scatter(TensorView output, const std::vector<TensorView>& input_list,
                      const ReduceScatterOptions& opts = {});
  // The single-buffer form: input holds world_size blocks back to back, each like output.
  void reduce_scatter(TensorView output, TensorView input, const ReduceScatterOptions& opts = {});
  void barrier(const BarrierOptions& opts = {});
  void send(TensorView tensor, int dst_rank, const SendOptions& opts = {});
  void recv(TensorView tensor, int src_rank, const RecvOptions& opts = {});

  // Multi-device forms (Ray's *_multigpu: one process driving several GPUs). `tensors` holds one
  // tensor per distinct local device, all of one shape and dtype; every process must drive the
  // same number of devices. Rank r's device d counts as collective rank r x devices + d.
  // Backends that take one device per op (gloo, shm) refuse lists longer than one.
  void allreduce_multigpu(const std::vector<TensorView>& tensors,
                          const AllreduceOptions& opts = {});
  // opts.root_rank / opts.root_tensor: the rank and the index into its list that receive.
  void reduce_multigpu(const std::vector<TensorView>& tensors, const ReduceOptions& opts = {});
  void broadcast_multigpu(const std::vector<TensorView>& tensors,
                          const BroadcastOptions& opts = {});
  // output_lists[d] has world_size x devices tensors: output_lists[d][r * devices + e] receives
  // rank r's tensors[e].
  void allgather_multigpu(const std::vector<std::vector<TensorView>>& output_lists,
                          const std::vector<TensorView>& inputs, const AllgatherOptions& opts = {});
  // input_lists[d] has world_size x devices tensors; outputs[d] receives the reduction of every
  // process's input_lists[.][r * devices + d], where r is this rank.
  void reduce_scatter_multigpu(const std::vector<TensorView>& outputs,
                               const std::vector<std::vector<TensorView>>& input_lists,
                               const ReduceScatterOptions& opts = {});
  // The first n_elements (0: all) of `tensor`, from this process's device to dst_rank's device
  // opts.dst_device_index (recv: from src_rank's opts.src_device_index).
  void send_multigpu(TensorView tensor, int dst_rank, int64_t n_elements = 0,
                     const SendOptions& opts = {});
  void recv_multigpu(TensorView tensor, int src_rank, int64_t n_elements = 0,
                     const RecvOptions& opts = {});
  // Waits on the host until every op enqueued on `device` has finished (a no-op for CPU).
  void synchronize(Device device);

  // "group 'default' (rank 1/4)"
  std::string describe() const;

 private:
  CollectiveGroup(std::string name, int rank, int world_size, std::string backend_name,
                  std::chrono::milliseconds timeout);
  struct Call;
  Call begin(OpType op, uint64_t signature, std::chrono::milliseconds timeout, int peer = -1,
             bool sending = false);
  template <typename Fn>
  void run(Call& call, Fn&& fn);
  void leave_store();
  [[noreturn]] void fail(ErrorCode code, OpType op, const std::string& what) const;
  void check_tensor(OpType op, const TensorView& t, const char* what) const;
  void check_rank(OpType op, int value, const char* what, bool allow_self = true) const;
  void check_reduce_op(OpType op, ReduceOp reduce_op, DType dtype) const;
  void check_device_list(OpType op, const std::vector<TensorView>& tensors, const char* what) const;
  void check_rooted_list(OpType op, const std::vector<TensorView>& tensors, int root_rank,
                         int root_tensor) const;
  TensorView check_p2p_multigpu(OpType op, const TensorView& tensor, int peer, int64_t n_elements,
                                int peer_device) const;

  const std::string name_;
  const int rank_;
  const int world_size_;
  const std::string backend_name_;
  const std::chrono::milliseconds timeout_;

  std::shared_ptr<Store> store_;  // the store the group met through
  std::string scope_;             // this incarnation's key prefix in store_
  bool owns_store_ = false;       // opened from a URL by this group

  std::atomic<bool> destroyed_{false};
  mutable std::mutex state_mutex_;  // guards abort_reason_
  std::string abort_reason_;        // non-empty once aborted

  // What the backend supports, read once at creation so validation never touches backend_.
  std::array<bool, 2> device_supported_{};  // by DeviceType
  std::array<bool, 8> op_supported_{};      // by OpType
  int max_devices_ = 1;

  std::mutex op_mutex_;  // serialises ops; guards the sequence counters and backend_ calls
  std::unique_ptr<Backend> backend_;
  uint64_t collective_seq_ = 0;
  std::map<int, uint64_t> send_seq_;  // per destination rank
  std::map<int, uint64_t> recv_seq_;  // per source rank
};

}  // namespace tutti
