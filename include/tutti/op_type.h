// OpType and OpContext: what an op is, and the per-call facts a group hands its backend.
//
// All functions here are pure and thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tutti/export.h"
#include "tutti/types.h"

namespace tutti {

enum class OpType {
  kBroadcast,
  kAllreduce,
  kReduce,
  kAllgather,
  kReduceScatter,
  kBarrier,
  kSend,
  kRecv,
  kAlltoall,
  kAlltoallv,
  kAllgatherv,
  kGather,
  kScatter,
  kBatchP2P,  // batch_isend_irecv: several sends and receives posted together
  kCount,     // not an op: the number of op types
};

constexpr size_t kOpTypeCount = static_cast<size_t>(OpType::kCount);

// "allreduce", "batch_isend_irecv", ...
TUTTI_API const char* to_string(OpType op) noexcept;

// What ranks must agree on for an op besides its place in the order: the group folds it into
// the op's tag, and mismatch errors print it ("allreduce float32[1000] sum").
struct OpSignature {
  OpType op = OpType::kBarrier;
  DType dtype = DType::kUInt8;
  int64_t count = 0;    // elements per tensor (allgatherv: of the output; alltoallv: 0)
  int root = -1;        // the root rank of rooted ops; -1 for none
  int root_tensor = 0;  // multi-device rooted ops: the index into the root's list
  int devices = 1;      // tensors per process (multi-device forms)
  int reduce_op = -1;   // a ReduceOp; -1 for none
  uint64_t layout = 0;  // anything else that must match (allgatherv: a hash of the counts)

  // "allreduce float32[1000] sum", "broadcast int64[3] root 1", "barrier"
  TUTTI_API std::string str() const;
  // A 64-bit hash of every field.
  TUTTI_API uint64_t hash() const;
};

// Per-call facts the group hands to the backend with each op; copied into async work, so it
// owns what it refers to.
struct OpContext {
  OpType op = OpType::kBarrier;
  // The op's sequence number: collectives count per group, point-to-point per peer and
  // direction. Equal on every rank that takes part in the same op.
  uint64_t seq = 0;
  // A 32-bit tag derived from seq and the op's signature (op, dtype, count, root, reduce op):
  // ranks that call mismatched ops get different tags, so their messages never meet.
  uint32_t tag = 0;
  OpSignature signature;                     // what the tag was derived from, for messages
  std::chrono::milliseconds timeout{30000};  // resolved (never kUseGroupTimeout)
  // Who is calling, for error messages.
  std::shared_ptr<const std::string> group_name;
  int rank = 0;
  int world_size = 1;
  // When the op started running (the group sets it as it hands the op over: one clock read
  // serves the deadline and the flight recorder). Unset (the clock's epoch): deadline() counts
  // from the call.
  std::chrono::steady_clock::time_point started{};

  // "allreduce #12 on group 'default' (rank 1/4)": built only when an error needs it.
  TUTTI_API std::string description() const;
  // started (or now) + timeout, saturated (a timeout of milliseconds::max() never overflows).
  TUTTI_API std::chrono::steady_clock::time_point deadline() const;
};

// now + timeout, saturated at the clock's maximum: for every deadline tutti computes.
TUTTI_API std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout);

}  // namespace tutti
