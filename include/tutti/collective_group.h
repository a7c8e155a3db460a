// CollectiveGroup: a set of ranks that run collectives together through one backend.
//
// The group owns its name, rank, world size and default timeout, validates every call before
// any I/O (each failure a tutti::Error naming group, rank, op and the offending value), and
// dispatches to its backend. Every op returns a Work (see tutti/work.h): already completed for
// a blocking call, running for one with `opts.async_op` (and for GPU ops, which return once
// enqueued). Blocking callers may ignore it.
//
// Order: every rank must issue a group's ops in the same order; ops run in the order they are
// issued.
// Threads: a group of a CPU backend (gloo, shm) takes its ops from one thread, the one that
// created it (async ops let that thread keep several in flight). An op from any other thread
// fails with kInvalidUsage before any I/O: ops of two threads could be numbered in a different
// order on each rank, and two ops of the same signature would then swap their data unnoticed.
// When that thread has ended, the next thread to issue an op takes the group over;
// issue_from_this_thread() hands it over explicitly (do that, rather than rely on the takeover,
// where two threads could race for a group). An NCCL group is not checked: issue its ops from
// one thread at a time, in the same order on every rank. abort(), destroy(), synchronize() and
// the accessors may be called from any thread at any time; Work handles too. Several groups run
// independently, side by side.
// Fork: a forked child cannot use its parent's groups: their ops fail with kInvalidUsage, and
// destroy (and the exit hook) leave the parent's threads, sockets and shared memory alone.
// Fork before creating groups, or create new ones in the child.
//
// Failure: kInvalidArgument / kInvalidUsage errors leave the group usable. A timeout, transport
// error or disagreement between ranks aborts the group: later ops fail with kAborted until it is
// destroyed and initialised again. See docs/errors.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/error.h"
#include "tutti/export.h"
#include "tutti/op_type.h"
#include "tutti/options.h"
#include "tutti/tensor_view.h"
#include "tutti/work.h"

namespace tutti {

class Store;
struct BackendInfo;
class SymmetricRegion;

// Memory from CollectiveGroup::allocate_symmetric: this rank's part of a buffer every rank
// allocated together, which the group's backend reaches on every rank without copying it
// through buffers of its own (the idea of NCCL's registered windows and torch's symmetric
// memory). Tensors viewed in it are ordinary CPU tensors; an allreduce whose tensor lies in
// such memory on every rank takes the single-copy path (shm: each rank reduces its slice from
// every rank's memory and writes the result into every rank's memory). Where the backend has
// no such memory (`symmetric()` false) it is ordinary memory and ops copy as usual.
// Lifetime: the memory lives while this object does. Peers keep their mapping of it until
// the group is destroyed, so allocate once and reuse, as with NCCL's windows.
class TUTTI_API SymmetricMemory {
 public:
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // False where the group's backend has no such memory, or some rank could not reach the
  // others' (logged): ordinary memory, ops copy as usual.
  bool symmetric() const { return symmetric_; }
  // A view of `shape` elements of `dtype` from `byte_offset`; kInvalidArgument when it does not
  // fit or the offset is not a multiple of the element size.
  TensorView view(DType dtype, const Shape& shape, size_t byte_offset = 0) const;

 private:
  friend class CollectiveGroup;
  // A committed region (`symmetric`: every rank attached), or ordinary memory `plain`.
  SymmetricMemory(std::unique_ptr<SymmetricRegion> region, bool symmetric,
                  std::shared_ptr<void> plain, size_t bytes);

  std::unique_ptr<SymmetricRegion> region_;
  bool symmetric_ = false;
  std::shared_ptr<void> plain_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

class TUTTI_API CollectiveGroup : public std::enable_shared_from_this<CollectiveGroup> {
 public:
  using WorkPtr = std::shared_ptr<Work>;

  // Joins a group: validates the arguments, meets the other ranks through the store (see
  // GroupOptions) and creates the backend. Throws Error(kInvalidArgument) for bad values,
  // kUnavailable for an unknown backend, kTimeout naming the missing ranks.
  // The process-wide registry of named groups (init_collective_group) is built on this; ranks
  // that are threads of one process create their groups here directly.
  static std::shared_ptr<CollectiveGroup> create(int world_size, int rank, std::string_view backend,
                                                 std::string_view group_name,
                                                 const GroupOptions& options = {});
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  const std::string& name() const;
  // This formation of the group, the same on every rank: each incarnation of a name (created
  // again after a destroy) and each subgroup has its own. What the group's OS resources are named
  // after; also a prefix for keys a layer above writes to the group's store.
  const std::string& instance() const;
  int rank() const;
  int world_size() const;
  const std::string& backend_name() const;
  std::chrono::milliseconds timeout() const;
  // This rank's rank, and every rank's, in the group this one was split from first (equal to
  // the group's own ranks for a group made by create()).
  int global_rank() const;
  const std::vector<int>& global_ranks() const;
  bool is_destroyed() const;
  bool is_aborted() const;

  // Hands the group to the calling thread: from now on its ops come from this thread (see
  // Threads above). For a program that moves a group from thread to thread in turn.
  void issue_from_this_thread();

  // Ends every op of this group, running or queued, with kAborted naming `reason`, promptly,
  // from any thread. The peers learn of it where the backend can tell them (their ops fail
  // instead of waiting out their timeouts). The group stays aborted: later ops fail with
  // kAborted; destroy it and initialise it again. Never throws; idempotent.
  void abort(const std::string& reason = "aborted by the application");

  // Tears down the backend. Local: it never waits for other ranks and never throws. An op still
  // running in another thread, or queued, is aborted first (kAborted). A rank that hosts the
  // group's TCP store keeps serving it on a thread until the other ranks have left, at most
  // 10 s, so that a fast rank 0 does not break slower ranks' teardown: destroy returns at once,
  // and the process's exit waits for that (at most the 10 s). Later calls fail with
  // kInvalidUsage. Idempotent. Subgroups split from this group live on.
  void destroy() noexcept;

  // Splits a subgroup off this group: collective, every rank of this group calls it with the
  // same `ranks` (distinct ranks of this group; their order gives the subgroup's ranks). The
  // members get the subgroup, the others null. The subgroup meets through this group's store (no
  // new rendezvous server), under a key only this split uses. With `options.local` only the
  // members call it (see SplitOptions).
  std::shared_ptr<CollectiveGroup> split(const std::vector<int>& ranks,
                                         const SplitOptions& options = {});

  // The survivors of a failure (typically: a rank died and this group is aborted) form a group of
  // themselves, through this group's store (no new server or store), renumbered in the order of
  // their ranks here, with the same backend. Every surviving rank calls it, once per failure.
  // A rank is taken for gone when it is in options.exclude, when its process on this host has
  // exited, or when its connection to the group's TCP store host closed; the survivors wait for
  // the others to call shrink too, up to options.timeout, and then go on without them. They
  // agree through the store (the first proposal of the members is everyone's), so all of them
  // get the same group; a rank that calls shrink after the members were decided without it gets
  // kAborted naming them. Works on an aborted group; this group stays as it is: destroy it (local:
  // it never waits on a dead rank). Throws kInvalidArgument for a bad exclude list before any
  // I/O.
  std::shared_ptr<CollectiveGroup> shrink(const ShrinkOptions& options = {});

  // Admits options.add new processes, without tearing this group down: every member calls grow
  // (collective, ordered with this group's ops as split is), and each new process calls join()
  // with the name this group's root was created under and the same store. The grown group keeps
  // the members' ranks and numbers the new ranks after them, in the order they joined; it meets
  // through this group's store (no new server) under a new incarnation, on this group's backend
  // (see GrowOptions). This group stays usable; destroy it when done. Fails with kTimeout naming
  // the ranks that did not come within options.timeout, kInvalidArgument for add < 1 (before
  // any I/O).
  std::shared_ptr<CollectiveGroup> grow(const GrowOptions& options = {});

  // A new process joins the next grow() of the group created as `group_name` (or of a group
  // shrunk or grown from it), through the store `options` names (store_url, store or env://, as
  // for create; a tcp:// store is reached as a client) and its job id. Waits up to
  // options.timeout for the members to call grow and fails with kTimeout saying so; the
  // group's op timeout, backend and check_ops are the members'.
  static std::shared_ptr<CollectiveGroup> join(std::string_view group_name,
                                               const GroupOptions& options = {});

  WorkPtr broadcast(TensorView tensor, const BroadcastOptions& opts = {});
  WorkPtr allreduce(TensorView tensor, const AllreduceOptions& opts = {});
  // Only the root's tensor changes.
  WorkPtr reduce(TensorView tensor, const ReduceOptions& opts = {});
  // output_list[r] receives rank r's input; world_size entries, each shaped like the input.
  WorkPtr allgather(const std::vector<TensorView>& output_list, TensorView input,
                    const AllgatherOptions& opts = {});
  // The single-buffer form: output holds the world's inputs back to back (world_size x numel).
  WorkPtr allgather(TensorView output, TensorView input, const AllgatherOptions& opts = {});
  // Ranks contribute different sizes: rank r's input has counts[r] elements, and output holds
  // them all back to back in rank order (sum of counts elements). Every rank passes the same
  // counts.
  WorkPtr allgatherv(TensorView output, TensorView input, const std::vector<int64_t>& counts,
                     const AllgathervOptions& opts = {});
  // output = reduction over ranks of input_list[rank]; world_size entries shaped like output.
  WorkPtr reduce_scatter(TensorView output, const std::vector<TensorView>& input_list,
                         const ReduceScatterOptions& opts = {});
  // The single-buffer form: input holds world_size blocks back to back, each like output.
  WorkPtr reduce_scatter(TensorView output, TensorView input,
                         const ReduceScatterOptions& opts = {});
  // input_list[r] goes to rank r; output_list[r] receives rank r's input_list[rank]. world_size
  // entries each, all of one dtype and size.
  WorkPtr alltoall(const std::vector<TensorView>& output_list,
                   const std::vector<TensorView>& input_list, const AlltoallOptions& opts = {});
  // The single-buffer form: input and output hold world_size equal blocks back to back; block r
  // of the input goes to rank r, block r of the output comes from rank r.
  WorkPtr alltoall(TensorView output, TensorView input, const AlltoallOptions& opts = {});
  // Blocks of different sizes: input_counts[r] elements of the input (back to back, in rank
  // order) go to rank r; output_counts[r] elements come from rank r. Each rank's
  // output_counts[r] must equal rank r's input_counts[rank].
  WorkPtr alltoallv(TensorView output, TensorView input, const std::vector<int64_t>& output_counts,
                    const std::vector<int64_t>& input_counts, const AlltoallOptions& opts = {});
  // The root's output_list[r] receives rank r's input (world_size entries shaped like the
  // input); the other ranks pass an empty list.
  WorkPtr gather(const std::vector<TensorView>& output_list, TensorView input,
                 const GatherOptions& opts = {});
  // The single-buffer form: the root's output holds world_size x input; elsewhere it is ignored
  // (an empty view will do).
  WorkPtr gather(TensorView output, TensorView input, const GatherOptions& opts = {});
  // Rank r's output receives the root's input_list[r] (world_size entries shaped like the
  // output); the other ranks pass an empty list.
  WorkPtr scatter(TensorView output, const std::vector<TensorView>& input_list,
                  const ScatterOptions& opts = {});
  // The single-buffer form: the root's input holds world_size x output; elsewhere it is ignored.
  WorkPtr scatter(TensorView output, TensorView input, const ScatterOptions& opts = {});
  WorkPtr barrier(const BarrierOptions& opts = {});
  WorkPtr send(TensorView tensor, int dst_rank, const SendOptions& opts = {});
  WorkPtr recv(TensorView tensor, int src_rank, const RecvOptions& opts = {});
  // Sends and receives to and from several peers, posted together (torch's batch_isend_irecv):
  // a ring (everyone sends right and receives left) or an all-pairs exchange in one call cannot
  // deadlock. Each message meets its peer's receive (or send) in the same position; see P2POp.
  WorkPtr batch_isend_irecv(const std::vector<P2POp>& ops, const BatchP2POptions& opts = {});

  // Multi-device forms (Ray's *_multigpu: one process driving several GPUs). `tensors` holds one
  // tensor per distinct local device, all of one shape and dtype; every process must drive the
  // same number of devices. Rank r's device d counts as collective rank r x devices + d.
  // Backends that take one device per op (gloo, shm) refuse lists longer than one.
  WorkPtr allreduce_multigpu(const std::vector<TensorView>& tensors,
                             const AllreduceOptions& opts = {});
  // opts.root_rank / opts.root_tensor: the rank and the index into its list that receive.
  WorkPtr reduce_multigpu(const std::vector<TensorView>& tensors, const ReduceOptions& opts = {});
  WorkPtr broadcast_multigpu(const std::vector<TensorView>& tensors,
                             const BroadcastOptions& opts = {});
  // output_lists[d] has world_size x devices tensors: output_lists[d][r * devices + e] receives
  // rank r's tensors[e].
  WorkPtr allgather_multigpu(const std::vector<std::vector<TensorView>>& output_lists,
                             const std::vector<TensorView>& inputs,
                             const AllgatherOptions& opts = {});
  // input_lists[d] has world_size x devices tensors; outputs[d] receives the reduction of every
  // process's input_lists[.][r * devices + d], where r is this rank.
  WorkPtr reduce_scatter_multigpu(const std::vector<TensorView>& outputs,
                                  const std::vector<std::vector<TensorView>>& input_lists,
                                  const ReduceScatterOptions& opts = {});
  // The first n_elements (0: all) of `tensor`, from this process's device to dst_rank's device
  // opts.dst_device_index (recv: from src_rank's opts.src_device_index).
  WorkPtr send_multigpu(TensorView tensor, int dst_rank, int64_t n_elements = 0,
                        const SendOptions& opts = {});
  WorkPtr recv_multigpu(TensorView tensor, int src_rank, int64_t n_elements = 0,
                        const RecvOptions& opts = {});
  // Waits on the host until every op enqueued on `device` has finished (CPU: every async op).
  void synchronize(Device device);

  // Collective: every rank calls it with the same `bytes` (> 0), in the same place in the op
  // order. Returns this rank's part of memory the backend reaches on every rank (see
  // SymmetricMemory); where the backend has none (gloo), or a rank could not make or map its
  // part (memory short), ordinary memory on every rank (symmetric() false, logged). Page-aligned
  // (shm) or 64-byte aligned, zeroed, CPU memory: kInvalidUsage for a backend without CPU
  // tensors (nccl). Blocking; its exchange is an allgather and an allreduce of the group
  // (recorded and checked as ops; errors name allocate_symmetric). kInvalidArgument on every
  // rank when the ranks asked for different sizes.
  std::shared_ptr<SymmetricMemory> allocate_symmetric(size_t bytes);
  // Whether `bytes` bytes from `data` lie within one live allocation of this group's whose
  // symmetric() is true. Local. shm's single-copy path needs it on every rank, for tensors over
  // its 16 KiB small-message path: of allreduce's and reduce's tensor, allgather's input (its
  // outputs apart from it), reduce_scatter's input list as one span of W blocks; of broadcast's
  // root's tensor alone.
  bool is_symmetric(const void* data, size_t bytes) const;
  bool is_symmetric(const TensorView& t) const { return is_symmetric(t.data(), t.nbytes()); }

  // "group 'default' (rank 1/4)"
  std::string describe() const;

  struct State;  // private: defined in the library

 private:
  explicit CollectiveGroup(std::shared_ptr<State> state);
  struct Call;
  template <typename Issue>
  WorkPtr submit(Call& call, Issue&& issue);
  template <typename Issue>
  WorkPtr run(Call& call, Issue&& issue);
  Call begin(OpType op, const OpSignature& signature, const OpOptions& opts,
             const Shape* shape = nullptr, int peer = -1, bool sending = false);
  void leave_store();
  // Forms the subgroup of `ranks` (this group's ranks, in the subgroup's order) that meets under
  // `base` in the store: split's and shrink's common end.
  std::shared_ptr<CollectiveGroup> form_subgroup(
      const std::vector<int>& ranks, const std::string& name, const std::string& base,
      const std::string& instance, const std::string& requested, const BackendInfo& info,
      bool inherited, bool with_parent, std::chrono::milliseconds timeout, const std::string& ctx,
      bool after_failure);

  std::shared_ptr<State> state_;
};

}  // namespace tutti
