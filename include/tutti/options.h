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

#include "tutti/types.h"

namespace tutti {

class Store;

// A timeout of kUseGroupTimeout (the default) means the group's timeout.
constexpr std::chrono::milliseconds kUseGroupTimeout{-1};

// What every op takes. `stream` is an opaque accelerator stream (a cudaStream_t for the NCCL
// backend; null means the device's default stream): the op runs after the work already queued
// there and returns once enqueued, its result ready for what is queued after it. `blocking`
// makes the call wait on the host until the op has finished. CPU backends ignore both (their
// ops always finish before returning).
struct OpOptions {
  std::chrono::milliseconds timeout = kUseGroupTimeout;
  void* stream = nullptr;
  bool blocking = false;
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

struct SendOptions : OpOptions {
  int dst_device_index = 0;  // the receiving process's device (multi-device forms)
};

struct RecvOptions : OpOptions {
  int src_device_index = 0;  // the sending process's device (multi-device forms)
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
};

}  // namespace tutti
