// The NCCL backend: CUDA tensors, one process driving one or several GPUs (internal).
//
// Communicators are made per device list on first use and cached by its key ("0", "0,1"); the
// NCCL unique id travels through the group's store, and NCCL rank = rank x GPUs per process +
// local index. Every rank makes its collective communicators in the same order (ops are
// ordered), so the n-th one meets under the store keys "coll/<n>". Point-to-point (send, recv,
// batch_p2p) uses a two-rank communicator per pair of (rank, GPU), as Ray does; a peer's GPU
// that the caller did not name (kPeerDevice) is asked of the peer once per pair of ranks and
// local GPU. alltoall, allgatherv, gather and scatter run on the collective communicator of
// their one device (grouped sends and receives, or broadcasts). Initialisation is
// non-blocking and bounded by the group's timeout; two ranks on one GPU are refused.
//
// Streams: each op waits (through an event) for the work already on the caller's stream, runs on
// the communicator's own stream, and makes the caller's stream wait for its completion; it
// returns once enqueued, with an NcclWork that completes when the op has finished on the GPU.
// opts.blocking: the call waits on the host instead, and makes the caller's stream wait only
// when the op failed (on success what the caller queues next comes after it anyway). A watchdog
// thread, woken by the first op after 100 ms without one and then looking every 2 ms, checks
// every pending op against its timeout and every communicator for NCCL's asynchronous errors; on
// either,
// and on abort(), every pending Work ends with an error (kTimeout for the op that timed out,
// kAborted for the others), the communicators are revoked (ncclCommRevoke, where NCCL has it and
// ncclCommShrink: kept, stopped, until the group is destroyed, so that a shrink can make the
// survivors' communicators from them) or aborted (ncclCommAbort), and every later call fails
// with kAborted naming the op that hung or failed. A failed group's communicators are aborted
// when it is destroyed, never destroyed: ncclCommDestroy may wait on a dead rank.
//
// Shrink: the survivors shrink each collective communicator they all have (ncclCommShrink of the
// revoked one, without the NCCL ranks of the ranks left out); where any survivor cannot, they
// all fall back to new communicators through the store (shrink()).
//
// Threads: the group calls one op at a time; the watchdog runs beside it, never calls into NCCL
// while the op thread is inside it (communicators are not thread-safe), and aborts without
// holding the lock (NCCL's abort may wait for a stuck stream). abort() may come from any
// thread. Works may be finished on the watchdog's thread, whose completion hooks may drop the
// last reference to this backend: the destructor then detaches the watchdog instead of joining
// it, and the watchdog touches nothing of the backend after finishing Works if it is gone.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_work.h"
#include "tutti/backend.h"
#include "tutti/error.h"
#include "tutti/store.h"

namespace tutti::nccl_backend {

struct NcclApi;

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(const BackendContext& ctx);
  ~NcclBackend() override;

  const char* name() const override { return "nccl"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCUDA; }
  int max_devices_per_op() const override { return 64; }
  bool runs_inline() const override { return false; }

  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override;
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allgather_into(const TensorView& output, const TensorView& input,
                         const AllgatherOptions& opts, const OpContext& ctx) override;
  WorkPtr allgatherv(const TensorView& output, const TensorView& input,
                     const std::vector<int64_t>& counts, const AllgathervOptions& opts,
                     const OpContext& ctx) override;
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr reduce_scatter_from(const TensorView& output, const TensorView& input,
                              const ReduceScatterOptions& opts, const OpContext& ctx) override;
  // alltoall_base (single buffers, equal or any counts) keeps Backend's default, which slices
  // the buffers into views and calls this.
  WorkPtr alltoall(const std::vector<TensorView>& outputs, const std::vector<TensorView>& inputs,
                   const AlltoallOptions& opts, const OpContext& ctx) override;
  WorkPtr gather(const std::vector<TensorView>& outputs, const TensorView& input,
                 const GatherOptions& opts, const OpContext& ctx) override;
  WorkPtr scatter(const TensorView& output, const std::vector<TensorView>& inputs,
                  const ScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
               const OpContext& ctx) override;
  WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
               const OpContext& ctx) override;
  WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                    const OpContext& ctx) override;
  void synchronize(Device device) override;
  // Ends every pending op (kAborted naming `reason`) and every later one, and aborts the
  // communicators (from any thread; the watchdog does the NCCL calls). split() keeps the
  // default: see the comment at its definition in nccl_backend.cc.
  void abort(const std::string& reason) override;
  // The survivors' backend from this (failed) one's collective communicators, through
  // ncclCommShrink; null (new communicators) where NCCL lacks it or any survivor failed.
  std::unique_ptr<Backend> shrink(const BackendContext& ctx) override;

 private:
  // The communicators of one device list (or one pair of (rank, GPU)), with a stream, an event
  // that orders the stream after the caller's, and a grow-only scratch buffer per device.
  struct Comms {
    std::vector<int> devices;
    std::vector<ncclComm_t> comms;
    std::vector<cudaStream_t> streams;
    std::vector<cudaEvent_t> ready;
    std::vector<void*> scratch;
    std::vector<size_t> scratch_bytes;
    int nranks = 0;
    int first_rank = 0;  // NCCL rank of devices[0]
    int index = -1;      // the n-th collective communicators made (n), -1 for pairs
  };
  // One communicator and device of an op: what launch() orders, watches and groups.
  struct Lane {
    Comms* c;
    size_t i;
    int device() const { return c->devices[i]; }
    ncclComm_t comm() const { return c->comms[i]; }
    cudaStream_t stream() const { return c->streams[i]; }
  };
  // Communicators to initialise together (init_comms).
  struct Init {
    Comms* c;
    std::string prefix;  // store keys
    bool make_id;        // this rank makes the unique id and publishes it
  };
  // One side of a point-to-point exchange: this process's device and the peer's (a device index
  // of the peer's process, or kPeerDevice until asked).
  struct Pair {
    int device;
    int peer;
    int peer_device;
  };
  // An enqueued op the watchdog waits for.
  struct Pending {
    std::shared_ptr<NcclWork> work;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };
  enum class Phase { kBefore, kNccl, kAfter };
  using Issue = std::function<void(Phase)>;

  static std::vector<Lane> lanes_of(Comms& c);
  Comms& collective_comms(const std::vector<TensorView>& tensors, const OpContext& ctx);
  // The pair communicator of each of `pairs`, made together where missing.
  std::vector<Comms*> pair_comms(std::vector<Pair> pairs, const OpContext& ctx);
  // Fills in every kPeerDevice of `pairs` (the peers are asked once, all at once).
  void resolve_peer_devices(std::vector<Pair>& pairs, const OpContext& ctx);
  void init_comms(const std::vector<Init>& inits, const OpContext& ctx);
  static void make_streams(Comms& c);  // a stream and an event per device
  // Aborts the communicators of `c` and destroys its streams and events (communicators that
  // never reached the maps: an init or a shrink that failed); leaves its handles null.
  void abandon(Comms& c) const;
  // Shrinks each of `parents` (revoked, quiescent, held by every survivor) without the NCCL
  // ranks of the ranks left out, into `made` in order (also what was made when it throws).
  void shrink_comms(const std::vector<Comms*>& parents, const BackendContext& sub,
                    std::chrono::steady_clock::time_point deadline,
                    std::vector<std::unique_ptr<Comms>>& made);
  // The comms of `comms` that could not be revoked are aborted and forgotten (the watchdog).
  void stop_comms(const std::vector<ncclComm_t>& comms);
  // Orders the lanes' streams after the caller's, runs issue(kBefore), issue(kNccl) inside one
  // NCCL group, issue(kAfter), then orders the caller's streams after the lanes' and hands the
  // op to the watchdog. Returns its Work, or null once it has finished (opts.blocking).
  WorkPtr launch(const std::vector<Lane>& lanes, const OpOptions& opts, const OpContext& ctx,
                 const Issue& issue);
  void* scratch(Comms& c, size_t i, size_t bytes);
  // The error every call gets once the communicators failed (the caller holds mutex_).
  Error aborted_locked(const OpContext& ctx) const;
  void check_nccl(ncclResult_t r, ncclComm_t comm, const OpContext& ctx, const char* what);
  void wait_enqueued(const std::vector<ncclComm_t>& comms, const OpContext& ctx, const char* what);
  // Records the first failure, ends every pending Work (the culprit's with `code` and `why`,
  // the others' with kAborted; those whose events have fired, successfully), and wakes the
  // watchdog to abort the communicators. From any thread holding no lock; touches nothing of
  // the backend after finishing the Works.
  void fail(const std::string& why, const NcclWork* culprit = nullptr,
            ErrorCode code = ErrorCode::kAborted);
  // Fails with `why` when an op is still pending (the destructor, before it finalizes).
  void abort_if_pending(const std::string& why);
  // Marks the communicators stopped and returns them: the caller revokes them (kept) or, where
  // NCCL cannot revoke, aborts them (their handles are gone).
  std::vector<ncclComm_t> take_comms_locked();
  void watchdog_loop(std::shared_ptr<std::atomic<bool>> gone);
  class InNccl;  // marks the op thread inside NCCL calls (the watchdog then defers the abort)

  const NcclApi& api_;
  int rank_;
  int world_size_;
  std::shared_ptr<Store> store_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::unique_ptr<Comms>> collective_;  // by device-list key
  std::map<std::string, std::unique_ptr<Comms>> p2p_;         // by pair key
  int collective_count_ = 0;                                  // communicators made so far
  std::string last_collective_;  // the device-list key of the last collective (for barrier)
  // The peer's device learnt for (peer, this process's device), and how many times each peer
  // was asked (both ends count alike: the n-th question meets under the same keys).
  std::map<std::pair<int, int>, int> peer_device_;
  std::map<int, int> peer_questions_;
  EventPool events_;

  std::mutex mutex_;  // guards pending_, failure_, aborted_, in_nccl_, stop_, napping_, listed_,
                      // the comms' handles
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::string failure_;   // non-empty once failed
  bool aborted_ = false;  // the communicators are being stopped (revoked or aborted)
  bool stopped_ = false;  // ... and have been (the watchdog's calls returned)
  bool in_nccl_ = false;  // the op thread is calling into NCCL: the watchdog's abort waits
  bool stop_ = false;
  // The watchdog's idle sleep (napping_: it is in it, and an op that lists itself wakes it;
  // listed_: an op was listed since the watchdog's last look). It naps only after kQuietLooks
  // looks with no op listed, so that a run of ops wakes it once, not once each (a blocking op
  // leaves the list as soon as it has finished, which left it empty for the next).
  static constexpr int kQuietLooks = 50;  // of 2 ms: 100 ms after the last op
  bool napping_ = false;
  bool listed_ = false;
  // Set when this backend is destroyed on the watchdog's own thread (a completion hook let go
  // of it); the watchdog then returns without touching the backend again.
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);
  std::thread watchdog_;
};

}  // namespace tutti::nccl_backend
