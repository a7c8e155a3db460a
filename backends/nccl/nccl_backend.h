// The NCCL backend: CUDA tensors, one process driving one or several GPUs (internal).
//
// Communicators are made per device list on first use and cached by its key ("0", "0,1"); the
// NCCL unique id travels through the group's store, and NCCL rank = rank x GPUs per process +
// local index. Every rank makes its collective communicators in the same order (ops are
// ordered), so the n-th one meets under the store keys "coll/<n>"; point-to-point uses a
// two-rank communicator per (rank, GPU) pair, as Ray does. Initialisation is non-blocking and
// bounded by the group's timeout; two ranks on one GPU are refused.
//
// Streams: each op waits (through an event) for the work already on the caller's stream, runs on
// the communicator's own stream, and makes the caller's stream wait for its completion; it
// returns once enqueued. A watchdog thread polls every pending op's completion event against
// its timeout and every communicator's asynchronous error; on either it aborts the
// communicators (ncclCommAbort), and every later call fails with kAborted naming the op that
// hung or failed. Threads: the group calls one op at a time; the watchdog runs beside it, never
// calls into NCCL while the op thread is inside it (communicators are not thread-safe), and
// aborts without holding the lock (NCCL's abort may wait for a stuck stream). abort() may come
// from any thread.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tutti/backend.h"
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

  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override;
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
               const OpContext& ctx) override;
  WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
               const OpContext& ctx) override;
  void synchronize(Device device) override;
  // Aborts the communicators (from any thread; the watchdog does the NCCL calls).
  void abort(const std::string& reason) override;

 private:
  // The communicators of one device list, with a stream and a grow-only scratch buffer each.
  struct Comms {
    std::vector<int> devices;
    std::vector<ncclComm_t> comms;
    std::vector<cudaStream_t> streams;
    std::vector<void*> scratch;
    std::vector<size_t> scratch_bytes;
    int nranks = 0;
    int first_rank = 0;  // NCCL rank of devices[0]
  };
  // An op's completion events, one per device, shared by the watchdog's entry and a blocking
  // caller: the last holder destroys them (CUDA forbids using a destroyed event).
  struct Events {
    std::vector<cudaEvent_t> e;
    Events() = default;
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
    ~Events();
  };
  // An enqueued op the watchdog waits for.
  struct Pending {
    std::shared_ptr<Events> done = std::make_shared<Events>();
    std::vector<int> devices;
    std::chrono::steady_clock::time_point deadline;
    std::string description;
  };

  Comms& collective_comms(const std::vector<TensorView>& tensors, const OpContext& ctx);
  Comms& p2p_comms(int device, int peer_rank, int peer_device, const OpContext& ctx);
  void init_comms(Comms& c, const std::string& store_prefix, bool i_make_the_id,
                  const OpContext& ctx);
  // Runs `issue(i)` for each device of c inside an NCCL group, ordered after the caller's streams
  // and ordering them after it; hands the completion to the watchdog.
  template <typename Issue>
  void launch(Comms& c, const OpOptions& opts, const OpContext& ctx, Issue&& issue);
  void* scratch(Comms& c, size_t i, size_t bytes);
  void check_failed(const OpContext& ctx);
  void check_nccl(ncclResult_t r, ncclComm_t comm, const OpContext& ctx, const char* what);
  void wait_enqueued(const std::vector<ncclComm_t>& comms, const OpContext& ctx, const char* what);
  void fail_all(const std::string& why);
  // Aborts when an op is still pending (the destructor; otherwise it finalizes).
  void abort_if_pending();
  std::vector<ncclComm_t> take_comms_locked();  // marks them aborted; the caller aborts them
  void watchdog_loop();
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

  std::mutex mutex_;  // guards pending_, failure_, aborted_, in_nccl_, stop_, the comms' handles
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::string failure_;  // non-empty once failed
  bool aborted_ = false;  // the communicators were aborted (their handles are gone)
  bool in_nccl_ = false;  // the op thread is calling into NCCL: the watchdog's abort waits
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace tutti::nccl_backend
