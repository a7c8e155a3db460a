// Backend: the plugin interface behind CollectiveGroup, and the registry of backends by name.
//
// A backend implements the transport of each op; CollectiveGroup has already validated every
// argument (ranks, roots, shapes, dtypes, devices, list lengths) before a backend method runs,
// and skips zero-element ops. Tensors come as device lists (one view per local device; CPU
// backends get exactly one) so that multi-GPU backends fit the same interface.
//
// Threads: CollectiveGroup calls one backend method at a time (ops are serialised per group),
// except abort(), which may come from any thread while an op is running.
// Errors: a backend throws tutti::Error; kTimeout, kIoError and kRemoteError abort the group.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/export.h"
#include "tutti/options.h"
#include "tutti/tensor_view.h"

namespace tutti {

class Store;

enum class OpType {
  kBroadcast,
  kAllreduce,
  kReduce,
  kAllgather,
  kReduceScatter,
  kBarrier,
  kSend,
  kRecv,
};

TUTTI_API const char* to_string(OpType op) noexcept;

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
};

// Per-call facts the group hands to the backend with each op.
struct OpContext {
  OpType op = OpType::kBarrier;
  // The op's sequence number: collectives count per group, point-to-point per peer and
  // direction. Equal on every rank that takes part in the same op.
  uint64_t seq = 0;
  // A 32-bit tag derived from seq and the op's signature (op, dtype, count, root, reduce op):
  // ranks that call mismatched ops get different tags, so their messages never meet.
  uint32_t tag = 0;
  std::chrono::milliseconds timeout{30000};  // resolved (never kUseGroupTimeout)
  // Who is calling, for error messages.
  const std::string* group_name = nullptr;
  int rank = 0;
  int world_size = 1;

  // "allreduce #12 on group 'default' (rank 1/4)": built only when an error needs it.
  TUTTI_API std::string description() const;
};

class TUTTI_API Backend {
 public:
  virtual ~Backend();

  virtual const char* name() const = 0;
  virtual bool supports(OpType op) const;           // all ops by default
  virtual bool supports_device(DeviceType type) const = 0;
  // The most tensors one op may take on this process (1 for CPU backends).
  virtual int max_devices_per_op() const { return 1; }

  // An op the backend lacks fails with "backend 'x' does not support 'op'" by default.
  virtual void broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                         const OpContext& ctx);
  virtual void allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                         const OpContext& ctx);
  virtual void reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                      const OpContext& ctx);
  // outputs[d][r * devices + e] receives rank r's inputs[e] (one device per op: outputs[0][r]).
  virtual void allgather(const std::vector<std::vector<TensorView>>& outputs,
                         const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                         const OpContext& ctx);
  // outputs[d] receives the reduction over every process and device of inputs[.][r * devices + d]
  // for this rank r (one device per op: inputs[0][r] reduced into outputs[0]).
  virtual void reduce_scatter(const std::vector<TensorView>& outputs,
                              const std::vector<std::vector<TensorView>>& inputs,
                              const ReduceScatterOptions& opts, const OpContext& ctx);
  virtual void barrier(const BarrierOptions& opts, const OpContext& ctx);
  virtual void send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
                    const OpContext& ctx);
  virtual void recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
                    const OpContext& ctx);

  // Waits on the host for every op enqueued on `device` (backends that enqueue asynchronously).
  virtual void synchronize(Device device);

  // Called once the group has failed or is being destroyed: release what may block. Must be
  // safe to call from any thread, more than once.
  virtual void abort() {}
};

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

// "auto" is always registered: a group asked for it uses "shm" when every rank runs on one host
// and tutti::shm is linked, else "gloo" (group->backend_name() says which).
//
// Registers a backend under a case-insensitive name. `available`, if given, says at run time
// whether the backend can work on this machine (its libraries load, a device exists).
// Throws Error(kInvalidUsage) when the name is already registered, kInvalidArgument when empty.
TUTTI_API void register_collective_backend(std::string_view name, BackendFactory factory,
                                           std::function<bool()> available = nullptr);
// False for unknown names.
TUTTI_API bool is_registered_collective_backend(std::string_view name);
// Registered and usable here. False for unknown names.
TUTTI_API bool is_backend_available(std::string_view name);
// Registered names, lower case, sorted.
TUTTI_API std::vector<std::string> registered_collective_backends();

}  // namespace tutti
