// Backend: the plugin interface behind CollectiveGroup, and the registry of backends by name.
//
// A backend implements the transport of each op; CollectiveGroup has already validated every
// argument (ranks, roots, shapes, dtypes, devices, list lengths, counts) before a backend method
// runs, and never hands it a zero-element op: a backend that runs inline gets a barrier() under
// that op's context instead (so a rank alone in calling it fails as any mismatch does), the
// others nothing. Tensors come as device lists (one view per local device; CPU backends get
// exactly one) so that multi-GPU backends fit the same interface. OpContext::signature says what
// the op is, for messages. With the op check on (GroupOptions::check_ops), an inline backend also
// sees an allgather_into of each collective's fingerprint before the collective, under a tag of
// its own.
//
// Each op returns a Work, or null when the op had finished by the time it returned (what CPU
// backends do: runs_inline()). The group then runs async ops of an inline backend on its own
// worker thread, one at a time, in issue order. A backend whose ops return once enqueued
// (runs_inline() false, e.g. NCCL) returns a Work that completes with the op.
//
// Ops with a default body below are built from other ops: the single-buffer forms slice their
// buffers into the list forms, and alltoall, alltoallv, allgatherv, gather and scatter post
// their messages with batch_p2p. A backend overrides them where it has a better way.
//
// Threads: the group calls one op at a time (never two ops of one backend at once), except
// abort(), which may come from any thread while an op is running, and must make it return
// promptly.
// Errors: a backend throws tutti::Error; kTimeout, kIoError, kRemoteError, kInternal and
// kAborted abort the group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/export.h"
#include "tutti/op_type.h"
#include "tutti/options.h"
#include "tutti/tensor_view.h"
#include "tutti/work.h"

namespace tutti {

class Store;
class Backend;

// What a backend is created with.
struct BackendContext {
  std::string group_name;
  int rank = 0;
  int world_size = 1;
  // A store private to this group incarnation: keys written here are never seen by another
  // group or by a later incarnation of this one.
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{30000};
  // Names this group incarnation uniquely on this host ("<job>.<group>.<incarnation>", escaped
  // to [A-Za-z0-9._%-]): for naming OS resources such as shared-memory segments.
  std::string instance;
  // By group rank: each rank's host identity (host name and boot id, or TUTTI_HOST_ID; equal
  // strings mean one host and one /dev/shm), process id, and rank in the group it was split
  // from first (its own rank for a group made by init).
  std::vector<std::string> hosts;
  std::vector<long> pids;
  std::vector<int> global_ranks;
  // When this group is split from another group of the same backend: that group's backend,
  // alive for the duration of the factory call (see Backend::split).
  Backend* parent = nullptr;
  // When this group is the survivors of a shrink of `parent` (see Backend::shrink): the parent
  // group's ranks left out, ascending. The survivors keep their order: parent rank r is rank
  // r - (ranks left out below r) here.
  bool from_shrink = false;
  std::vector<int> shrunk_without;
};

// One message of a batch_p2p, as the group hands it to the backend: seq and tag follow the
// plain send/recv numbering (per peer and direction), so a batched send meets a plain recv.
// peer_device_index (like SendOptions::dst_device_index and RecvOptions::src_device_index) is
// kPeerDevice when the caller named no device (single-tensor send/recv, P2POp::send/recv).
struct P2PRequest {
  P2POp::Kind kind = P2POp::Kind::kSend;
  TensorView tensor;
  int peer = 0;
  int peer_device_index = kPeerDevice;
  uint64_t seq = 0;
  uint32_t tag = 0;
};

// One rank's part of memory that every rank's ops reach (Backend::create_symmetric). The group
// makes one on each rank, gives each every rank's descriptor(), and commits them once every
// rank has attached; the memory lives as long as the region.
class TUTTI_API SymmetricRegion {
 public:
  static constexpr size_t kDescriptorBytes = 128;

  virtual ~SymmetricRegion();
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  // How a peer reaches this rank's memory: at most kDescriptorBytes.
  virtual std::string descriptor() const = 0;
  // Reaches every rank's memory (descriptors by rank, this rank's included). Throws a
  // tutti::Error naming what failed; the group then commits every rank's region with false.
  virtual void attach(const std::vector<std::string>& descriptors) = 0;
  // `everyone`: every rank attached, so the ops may use the memory directly; false leaves it
  // ordinary memory of this rank. Called once, after every rank's attach.
  virtual void commit(bool everyone) = 0;
};

class TUTTI_API Backend {
 public:
  using WorkPtr = std::shared_ptr<Work>;

  virtual ~Backend();

  virtual const char* name() const = 0;
  virtual bool supports(OpType op) const;  // all ops by default
  virtual bool supports_device(DeviceType type) const = 0;
  // The most tensors one op may take on this process (1 for CPU backends).
  virtual int max_devices_per_op() const { return 1; }
  // True (the default) when each op runs to completion in the calling thread.
  virtual bool runs_inline() const { return true; }

  // An op the backend lacks fails with "backend 'x' does not support 'op'" by default.
  virtual WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                            const OpContext& ctx);
  virtual WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                            const OpContext& ctx);
  virtual WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                         const OpContext& ctx);
  // outputs[d][r * devices + e] receives rank r's inputs[e] (one device per op: outputs[0][r]).
  virtual WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                            const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                            const OpContext& ctx);
  // One device, one buffer: output holds world_size blocks shaped like input, in rank order.
  virtual WorkPtr allgather_into(const TensorView& output, const TensorView& input,
                                 const AllgatherOptions& opts, const OpContext& ctx);
  // output holds counts[r] elements of rank r, back to back in rank order; input has
  // counts[rank] elements.
  virtual WorkPtr allgatherv(const TensorView& output, const TensorView& input,
                             const std::vector<int64_t>& counts, const AllgathervOptions& opts,
                             const OpContext& ctx);
  // outputs[d] receives the reduction over every process and device of inputs[.][r * devices + d]
  // for this rank r (one device per op: inputs[0][r] reduced into outputs[0]).
  virtual WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                                 const std::vector<std::vector<TensorView>>& inputs,
                                 const ReduceScatterOptions& opts, const OpContext& ctx);
  // One device, one buffer: input holds world_size blocks shaped like output, in rank order.
  virtual WorkPtr reduce_scatter_from(const TensorView& output, const TensorView& input,
                                      const ReduceScatterOptions& opts, const OpContext& ctx);
  // inputs[r] goes to rank r, outputs[r] comes from rank r (sizes may differ from peer to peer;
  // each matches its peer's counterpart).
  virtual WorkPtr alltoall(const std::vector<TensorView>& outputs,
                           const std::vector<TensorView>& inputs, const AlltoallOptions& opts,
                           const OpContext& ctx);
  // One buffer each way: input_counts[r] elements go to rank r and output_counts[r] come from
  // it, blocks back to back in rank order (equal counts for alltoall, any for alltoallv).
  virtual WorkPtr alltoall_base(const TensorView& output, const TensorView& input,
                                const std::vector<int64_t>& output_counts,
                                const std::vector<int64_t>& input_counts,
                                const AlltoallOptions& opts, const OpContext& ctx);
  // The root's outputs[r] receives rank r's input; outputs is empty on the other ranks.
  virtual WorkPtr gather(const std::vector<TensorView>& outputs, const TensorView& input,
                         const GatherOptions& opts, const OpContext& ctx);
  // Rank r's output receives the root's inputs[r]; inputs is empty on the other ranks.
  virtual WorkPtr scatter(const TensorView& output, const std::vector<TensorView>& inputs,
                          const ScatterOptions& opts, const OpContext& ctx);
  virtual WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx);
  virtual WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank,
                       const SendOptions& opts, const OpContext& ctx);
  virtual WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank,
                       const RecvOptions& opts, const OpContext& ctx);
  // Posts every send and receive before waiting for any, so that rings and all-pairs exchanges
  // cannot deadlock. Requests to one peer and direction run in order.
  virtual WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                            const OpContext& ctx);

  // Waits on the host for every op enqueued on `device` (backends that enqueue asynchronously).
  virtual void synchronize(Device device);

  // Called on the members of a subgroup being split from a group of the same backend, with the
  // subgroup's context (ctx.parent is this backend). Returns the subgroup's backend when this
  // backend can derive it cheaply from what only the members do, or null to have it made by the
  // registered factory (the default). Non-members are not called, so a split that needs every
  // parent rank (NCCL's ncclCommSplit) cannot be made here; the NCCL backend keeps the default.
  virtual std::unique_ptr<Backend> split(const BackendContext& ctx);

  // Called on every survivor of CollectiveGroup::shrink (never on the ranks left out), with the
  // survivors' context (ctx.parent is this backend, already aborted; ctx.shrunk_without the
  // ranks left out). Returns the survivors' backend when this one can derive it from its own
  // connections (NCCL: ncclCommShrink), or null to have it made by the registered factory (the
  // default). An implementation must return null on every survivor or on none: it agrees with
  // the others through ctx.store before it returns.
  virtual std::unique_ptr<Backend> shrink(const BackendContext& ctx);

  // Ends every op of this backend, running or future, with an error, promptly (well within
  // 100 ms), from any thread, more than once. Where the transport allows it, the peers learn of
  // it too (their ops fail instead of waiting out their timeouts). `reason` says why, for
  // messages.
  virtual void abort(const std::string& reason) = 0;

  // Memory of this rank that the backend's ops on the other ranks reach directly
  // (CollectiveGroup::allocate_symmetric), or null (the default) where the backend has none.
  // Local: the group exchanges the regions' descriptors and calls attach and commit. Called on
  // the group's issuing thread, beside ops the backend may be running on another (async ops):
  // what it shares with them must be locked. Last in the class, but a backend built against a
  // header without it has no slot for it: rebuild out-of-tree backends (the C++ ABI of 0.x).
  virtual std::unique_ptr<SymmetricRegion> create_symmetric(size_t bytes);
};

// What a backend is registered with.
struct BackendInfo {
  enum class Scope {
    kOneHost,  // every rank must run on one host (e.g. shared memory)
    kAnyHost,  // ranks may run on any hosts
  };
  std::string name;  // case-insensitive, not "auto"
  std::function<std::unique_ptr<Backend>(const BackendContext&)> factory;
  // Whether the backend can work on this machine (its libraries load, a device exists); null
  // means always.
  std::function<bool()> available;
  Scope scope = Scope::kAnyHost;
  // The devices its tensors may live on.
  std::vector<DeviceType> devices{DeviceType::kCPU};
  // "auto" takes the available CPU backend of highest priority whose scope fits the ranks' hosts.
  int priority = 0;
  // Whether "auto" may take it for ranks on these hosts (one entry per rank), beyond its scope;
  // null means always. For backends that only pay off for some layouts (hier: several hosts
  // with several ranks on one).
  std::function<bool(const std::vector<std::string>& hosts)> suits;
};

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

// Registers a backend under a case-insensitive name. "auto" is reserved: a group asked for it
// takes the available CPU backend of highest priority whose scope fits the ranks' hosts (shm on
// one host, else gloo, as registered; group->backend_name() says which).
// Throws Error(kInvalidUsage) when the name is already registered or is "auto",
// kInvalidArgument when empty or without a factory.
TUTTI_API void register_collective_backend(BackendInfo info);
// The short form: a backend of any host, on CPU, priority 0.
TUTTI_API void register_collective_backend(std::string_view name, BackendFactory factory,
                                           std::function<bool()> available = nullptr);
// False for unknown names.
TUTTI_API bool is_registered_collective_backend(std::string_view name);
// Registered and usable here. False for unknown names.
TUTTI_API bool is_backend_available(std::string_view name);
// Registered names, lower case, sorted.
TUTTI_API std::vector<std::string> registered_collective_backends();
// Makes a backend of a registered name with `ctx` (collective over ctx's ranks, like the
// factory): for backends built from others. Error(kUnavailable) when the name is unknown or
// not available here.
TUTTI_API std::unique_ptr<Backend> create_collective_backend(std::string_view name,
                                                             const BackendContext& ctx);

}  // namespace tutti
