// One plain options struct per operation, with defaulted members (c10d's Types.hpp style).
//
// Set only the members you need:
//   tutti::AllreduceOptions opts;
//   opts.reduce_op = tutti::ReduceOp::kMax;
//   opts.timeout = std::chrono::seconds(5);
//   group->allreduce(tensor, opts);
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tutti/tensor_view.h"
#include "tutti/types.h"

namespace tutti {

class Store;

// A timeout of kUseGroupTimeout (the default) means the group's timeout.
constexpr std::chrono::milliseconds kUseGroupTimeout{-1};

// What every op takes.
// - `timeout`: how long the op may take once it has started (the group's timeout by default).
// - `async_op`: return at once with a Work that completes when the op has finished (c10d's
//   async_op). CPU backends then run the op on the group's worker thread, in issue order; the
//   op's buffers are the op's until Work::wait() returns. Without it, a CPU op has finished
//   when the call returns. An op issued on the worker itself (from a Work::on_finish hook) runs
//   there at once, before ops queued behind the one whose hook issued it: every rank must
//   issue it at the same point of its order, as with any op.
// - `stream`: an opaque accelerator stream (a cudaStream_t for the NCCL backend): a GPU op runs
//   after the work already queued there and returns once enqueued, its result ready for what is
//   queued after it. Null means the device's *legacy* default stream (tutti is not built with
//   per-thread default streams): correct for callers on the per-thread stream too, since the
//   legacy stream synchronises with every blocking stream, but it serialises them; such callers
//   pass cudaStreamPerThread explicitly. CPU backends ignore it.
// - `blocking`: a GPU op also waits on the host until it has finished, and then leaves the
//   caller's stream alone (what is queued there next runs after the op anyway). One that fails
//   (a timeout, an abort) makes the caller's stream wait for the op's, as a non-blocking op does,
//   so that nothing queued there meets the op while it is being stopped. CPU backends ignore it.
struct OpOptions {
  std::chrono::milliseconds timeout = kUseGroupTimeout;
  void* stream = nullptr;
  bool blocking = false;
  bool async_op = false;
};

struct BroadcastOptions : OpOptions {
  int root_rank = 0;
  int root_tensor = 0;  // index into the root's device list (multi-device forms)
};

struct AllreduceOptions : OpOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
};

struct ReduceOptions : OpOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
  int root_rank = 0;
  int root_tensor = 0;
};

struct AllgatherOptions : OpOptions {};

struct ReduceScatterOptions : OpOptions {
  ReduceOp reduce_op = ReduceOp::kSum;
};

struct BarrierOptions : OpOptions {};

// A peer device index that names no device: the peer's matching op runs on whichever device
// it uses, and a backend that needs to know asks the peer (the NCCL backend does, once per pair
// of ranks and local device). What the single-tensor send/recv and P2POp::send/recv mean.
constexpr int kPeerDevice = -1;

struct SendOptions : OpOptions {
  // The receiving process's device (multi-device forms only; the single-tensor send() passes
  // kPeerDevice to the backend whatever this says).
  int dst_device_index = 0;
};

struct RecvOptions : OpOptions {
  // The sending process's device (multi-device forms only, as above).
  int src_device_index = 0;
};

struct AlltoallOptions : OpOptions {};

struct AllgathervOptions : OpOptions {};

struct GatherOptions : OpOptions {
  int root_rank = 0;
};

struct ScatterOptions : OpOptions {
  int root_rank = 0;
};

// One send or receive of a batch (batch_isend_irecv). Every send meets the receive of the same
// peer in the same position: the k-th message from rank a to rank b, counting plain send() /
// recv() and batched ones alike, meets b's k-th receive from a.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  TensorView tensor;
  int peer = 0;  // the destination of a send, the source of a receive
  // The peer process's device (multi-device backends), or kPeerDevice: whichever device the
  // peer's matching op uses.
  int peer_device_index = kPeerDevice;

  static P2POp send(TensorView tensor, int dst_rank) {
    return {Kind::kSend, tensor, dst_rank, kPeerDevice};
  }
  static P2POp recv(TensorView tensor, int src_rank) {
    return {Kind::kRecv, tensor, src_rank, kPeerDevice};
  }
};

struct BatchP2POptions : OpOptions {};

// How CollectiveGroup::split makes a subgroup.
struct SplitOptions {
  std::string name;     // empty: "<parent>.split<n>", n counting the parent's splits from 0
  std::string backend;  // empty: the parent's backend
  std::chrono::milliseconds timeout = kUseGroupTimeout;  // default: the parent's timeout
  // Only the members call split (torch's use_local_synchronization): the others never learn of
  // it, and it is not ordered with the parent's ops or other splits, so any thread may call it
  // at any time. `name` is then required: it identifies the meeting, so it must be new among
  // the local splits of this incarnation of the parent (a name used again here is refused).
  bool local = false;
};

// CollectiveGroup::shrink: the survivors of a failure form a group without the ranks that died.
struct ShrinkOptions {
  // Ranks of this group to leave out: dead ones the caller knows of (a failure named them), or
  // ones not wanted. The others are found by shrink itself (see CollectiveGroup::shrink).
  std::vector<int> exclude;
  std::string name;     // empty: "<this group>.shrink<n>", n counting this group's shrinks from 0
  std::string backend;  // empty: this group's backend
  // How long the survivors wait for a rank that is not known gone to call shrink too, before
  // they go on without it. Default: the group's timeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

// CollectiveGroup::grow: the members admit new processes, which call CollectiveGroup::join.
struct GrowOptions {
  int add = 1;       // how many new ranks join (at least 1)
  std::string name;  // empty: "<this group>.grow<n>", n counting this group's grows from 0
  // Empty: this group's backend, or what "auto" picks when that does not suit the grown group's
  // hosts (shm, say, when a new rank is on another host).
  std::string backend;
  // How long the members wait for the new ranks. Default: the group's timeout.
  std::chrono::milliseconds timeout = kUseGroupTimeout;
};

// How a group meets its peers and how long it waits by default.
struct GroupOptions {
  // A store URL (see open_store), e.g. "tcp://10.0.0.1:29500" (rank 0 hosts it) or
  // "file:///tmp/job.store"; "env://" takes the launcher's (see tutti/env.h). Ignored when
  // `store` is set.
  std::string store_url;
  // A store object shared with the other ranks (e.g. a HashStore for ranks that are threads).
  std::shared_ptr<Store> store;
  // The default timeout of every op and of the rendezvous (Ray's Gloo groups use 30 s).
  std::chrono::milliseconds timeout{30000};
  // Scopes every key the group writes, so a crashed earlier job with the same group name on a
  // long-lived store is never read. Empty: TUTTI_JOB_ID, else the TCP store's own nonce.
  std::string job_id;
  // Before each collective the ranks compare what they called (op, sequence number, dtype,
  // shape, root, reduce op) and fail it on every rank with a diff naming the ranks that
  // disagree (kInvalidUsage; the group stays usable). Costs one small allgather per collective;
  // CPU backends only. TUTTI_DEBUG=DETAIL turns it on for every group. Subgroups inherit it.
  bool check_ops = false;
};

}  // namespace tutti
