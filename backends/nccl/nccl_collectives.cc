// The NCCL backend's collectives. Each finds (or makes) the collective communicators of its
// device list and hands launch() what to enqueue in each phase. alltoall, allgatherv, gather
// and scatter take one device per process (the group's API has no device-list form of them).
#include "nccl_api.h"
#include "nccl_backend.h"
#include "nccl_types.h"
#include "nccl_util.h"

namespace tutti::nccl_backend {
namespace {

// A device-to-device copy on `stream` (the own block of gather, scatter and alltoall), skipped
// when empty or in place.
void copy_on(cudaStream_t stream, const TensorView& to, const TensorView& from) {
  if (to.nbytes() == 0 || to.data() == from.data()) return;
  cuda_check(cudaMemcpyAsync(to.data(), from.data(), to.nbytes(), cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync");
}

size_t count_of(const TensorView& t) {
  return static_cast<size_t>(t.numel());
}

}  // namespace

Backend::WorkPtr NcclBackend::allreduce(const std::vector<TensorView>& tensors,
                                        const AllreduceOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, tensors[0].dtype());
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    for (size_t i = 0; i < tensors.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.AllReduce(tensors[i].data(), tensors[i].data(), count_of(tensors[i]), dt, op,
                                c.comms[i], c.streams[i]),
                 c.comms[i], ctx, "ncclAllReduce");
    }
  });
}

Backend::WorkPtr NcclBackend::broadcast(const std::vector<TensorView>& tensors,
                                        const BroadcastOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const int k = static_cast<int>(tensors.size());
  const int root = nccl_rank(opts.root_rank, k, opts.root_tensor);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    for (int i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.Broadcast(tensors[i].data(), tensors[i].data(), count_of(tensors[i]), dt,
                                root, c.comms[i], c.streams[i]),
                 c.comms[i], ctx, "ncclBroadcast");
    }
  });
}

Backend::WorkPtr NcclBackend::reduce(const std::vector<TensorView>& tensors,
                                     const ReduceOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const int k = static_cast<int>(tensors.size());
  const int root = nccl_rank(opts.root_rank, k, opts.root_tensor);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, tensors[0].dtype());
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    for (int i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      // In place: only the root's buffer receives (NCCL reads the others' as input only).
      check_nccl(api_.Reduce(tensors[i].data(), tensors[i].data(), count_of(tensors[i]), dt, op,
                             root, c.comms[i], c.streams[i]),
                 c.comms[i], ctx, "ncclReduce");
    }
  });
}

// The list form: NCCL gathers into one buffer per device (the scratch buffer), then each block
// is copied to its tensor. One buffer from the caller takes allgather_into instead.
Backend::WorkPtr NcclBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                                        const std::vector<TensorView>& inputs,
                                        const AllgatherOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms(inputs, ctx);
  const ncclDataType_t dt = to_nccl(inputs[0].dtype());
  const size_t bytes = inputs[0].nbytes();
  std::vector<char*> gathered(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    gathered[i] = static_cast<char*>(scratch(c, i, bytes * outputs[i].size()));
  }
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      if (phase == Phase::kNccl) {
        check_nccl(api_.AllGather(inputs[i].data(), gathered[i], count_of(inputs[i]), dt,
                                  c.comms[i], c.streams[i]),
                   c.comms[i], ctx, "ncclAllGather");
      } else if (phase == Phase::kAfter) {
        for (size_t j = 0; j < outputs[i].size(); ++j) {
          cuda_check(cudaMemcpyAsync(outputs[i][j].data(), gathered[i] + j * bytes, bytes,
                                     cudaMemcpyDeviceToDevice, c.streams[i]),
                     "cudaMemcpyAsync");
        }
      }
    }
  });
}

// In place when the input is this rank's block of the output, as NCCL allows.
Backend::WorkPtr NcclBackend::allgather_into(const TensorView& output, const TensorView& input,
                                             const AllgatherOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms({input}, ctx);
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(api_.AllGather(input.data(), output.data(), count_of(input), to_nccl(input.dtype()),
                              c.comms[0], c.streams[0]),
               c.comms[0], ctx, "ncclAllGather");
  });
}

// One broadcast per rank with its count, in one NCCL group (as c10d gathers uneven sizes): each
// rank's block goes straight to its place in every output.
Backend::WorkPtr NcclBackend::allgatherv(const TensorView& output, const TensorView& input,
                                         const std::vector<int64_t>& counts,
                                         const AllgathervOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms({input}, ctx);
  const ncclDataType_t dt = to_nccl(input.dtype());
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    DeviceGuard guard(c.devices[0]);
    int64_t offset = 0;
    for (int r = 0; r < world_size_; ++r) {
      const TensorView block = output.slice(offset, counts[r]);
      offset += counts[r];
      if (counts[r] == 0) continue;  // every rank knows the counts: all skip alike
      const void* send = r == rank_ ? input.data() : block.data();
      check_nccl(
          api_.Broadcast(send, block.data(), count_of(block), dt, r, c.comms[0], c.streams[0]),
          c.comms[0], ctx, "ncclBroadcast (allgatherv)");
    }
  });
}

// The list form: each device's blocks are copied into one buffer (the scratch buffer), which
// NCCL reduces and scatters. One buffer from the caller takes reduce_scatter_from instead.
Backend::WorkPtr NcclBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                             const std::vector<std::vector<TensorView>>& inputs,
                                             const ReduceScatterOptions& opts,
                                             const OpContext& ctx) {
  Comms& c = collective_comms(outputs, ctx);
  const ncclDataType_t dt = to_nccl(outputs[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, outputs[0].dtype());
  const size_t bytes = outputs[0].nbytes();
  std::vector<char*> packed(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    packed[i] = static_cast<char*>(scratch(c, i, bytes * inputs[i].size()));
  }
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      if (phase == Phase::kBefore) {
        for (size_t j = 0; j < inputs[i].size(); ++j) {
          cuda_check(cudaMemcpyAsync(packed[i] + j * bytes, inputs[i][j].data(), bytes,
                                     cudaMemcpyDeviceToDevice, c.streams[i]),
                     "cudaMemcpyAsync");
        }
      } else if (phase == Phase::kNccl) {
        check_nccl(api_.ReduceScatter(packed[i], outputs[i].data(), count_of(outputs[i]), dt, op,
                                      c.comms[i], c.streams[i]),
                   c.comms[i], ctx, "ncclReduceScatter");
      }
    }
  });
}

// In place when the output is this rank's block of the input, as NCCL allows.
Backend::WorkPtr NcclBackend::reduce_scatter_from(const TensorView& output, const TensorView& input,
                                                  const ReduceScatterOptions& opts,
                                                  const OpContext& ctx) {
  Comms& c = collective_comms({output}, ctx);
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(
        api_.ReduceScatter(input.data(), output.data(), count_of(output), to_nccl(output.dtype()),
                           to_nccl(opts.reduce_op, output.dtype()), c.comms[0], c.streams[0]),
        c.comms[0], ctx, "ncclReduceScatter");
  });
}

// Grouped sends and receives on the collective communicator (one kernel per rank, as c10d's
// all-to-all), peers in the order rank+1, rank+2, ... ; the own block is a copy. Empty blocks
// are left out on both sides (a sender's count is its receiver's).
Backend::WorkPtr NcclBackend::alltoall(const std::vector<TensorView>& outputs,
                                       const std::vector<TensorView>& inputs,
                                       const AlltoallOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms({inputs[rank_]}, ctx);
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    DeviceGuard guard(c.devices[0]);
    if (phase == Phase::kBefore) copy_on(c.streams[0], outputs[rank_], inputs[rank_]);
    if (phase != Phase::kNccl) return;
    for (int k = 1; k < world_size_; ++k) {
      const int to = (rank_ + k) % world_size_;
      const int from = (rank_ - k + world_size_) % world_size_;
      if (inputs[to].numel() > 0) {
        check_nccl(api_.Send(inputs[to].data(), count_of(inputs[to]), to_nccl(inputs[to].dtype()),
                             to, c.comms[0], c.streams[0]),
                   c.comms[0], ctx, "ncclSend (alltoall)");
      }
      if (outputs[from].numel() > 0) {
        check_nccl(api_.Recv(outputs[from].data(), count_of(outputs[from]),
                             to_nccl(outputs[from].dtype()), from, c.comms[0], c.streams[0]),
                   c.comms[0], ctx, "ncclRecv (alltoall)");
      }
    }
  });
}

Backend::WorkPtr NcclBackend::gather(const std::vector<TensorView>& outputs,
                                     const TensorView& input, const GatherOptions& opts,
                                     const OpContext& ctx) {
  Comms& c = collective_comms({input}, ctx);
  const ncclDataType_t dt = to_nccl(input.dtype());
  const int root = opts.root_rank;
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    DeviceGuard guard(c.devices[0]);
    if (phase == Phase::kBefore && rank_ == root) copy_on(c.streams[0], outputs[root], input);
    if (phase != Phase::kNccl) return;
    if (rank_ != root) {
      check_nccl(api_.Send(input.data(), count_of(input), dt, root, c.comms[0], c.streams[0]),
                 c.comms[0], ctx, "ncclSend (gather)");
      return;
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == root) continue;
      check_nccl(
          api_.Recv(outputs[r].data(), count_of(outputs[r]), dt, r, c.comms[0], c.streams[0]),
          c.comms[0], ctx, "ncclRecv (gather)");
    }
  });
}

Backend::WorkPtr NcclBackend::scatter(const TensorView& output,
                                      const std::vector<TensorView>& inputs,
                                      const ScatterOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms({output}, ctx);
  const ncclDataType_t dt = to_nccl(output.dtype());
  const int root = opts.root_rank;
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    DeviceGuard guard(c.devices[0]);
    if (phase == Phase::kBefore && rank_ == root) copy_on(c.streams[0], output, inputs[root]);
    if (phase != Phase::kNccl) return;
    if (rank_ != root) {
      check_nccl(api_.Recv(output.data(), count_of(output), dt, root, c.comms[0], c.streams[0]),
                 c.comms[0], ctx, "ncclRecv (scatter)");
      return;
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == root) continue;
      check_nccl(api_.Send(inputs[r].data(), count_of(inputs[r]), dt, r, c.comms[0], c.streams[0]),
                 c.comms[0], ctx, "ncclSend (scatter)");
    }
  });
}

Backend::WorkPtr NcclBackend::barrier(const BarrierOptions& opts, const OpContext& ctx) {
  // NCCL has no barrier: a one-element allreduce, waited for, over the devices of the last
  // collective (the same communicator on every rank, which all ran the same collectives), or
  // over this process's current GPU before any. Not simply the current GPU: a rank whose
  // current GPU changed would make a communicator that its peers never make.
  std::vector<TensorView> probes;
  if (auto it = collective_.find(last_collective_); it != collective_.end()) {
    for (int d : it->second->devices) {
      probes.emplace_back(reinterpret_cast<void*>(16), DType::kUInt8, std::vector<int64_t>{1},
                          Device::cuda(d));
    }
  } else {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    probes.emplace_back(reinterpret_cast<void*>(16), DType::kUInt8, std::vector<int64_t>{1},
                        Device::cuda(device));
  }
  Comms& c = collective_comms(probes, ctx);
  std::vector<void*> one(c.devices.size());
  for (size_t i = 0; i < one.size(); ++i) one[i] = scratch(c, i, 16);
  BarrierOptions blocking = opts;
  blocking.blocking = true;
  return launch(lanes_of(c), blocking, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    for (size_t i = 0; i < one.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.AllReduce(one[i], one[i], 1, ncclUint8, ncclMax, c.comms[i], c.streams[i]),
                 c.comms[i], ctx, "ncclAllReduce (barrier)");
    }
  });
}

}  // namespace tutti::nccl_backend
