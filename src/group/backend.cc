#include "tutti/backend.h"

#include <cstring>

#include "group/group_util.h"
#include "tutti/error.h"

namespace tutti {

Backend::~Backend() = default;

SymmetricRegion::~SymmetricRegion() = default;

std::unique_ptr<SymmetricRegion> Backend::create_symmetric(size_t) {
  return nullptr;
}

bool Backend::supports(OpType) const {
  return true;
}

void Backend::synchronize(Device) {}

std::unique_ptr<Backend> Backend::split(const BackendContext&) {
  return nullptr;
}

std::unique_ptr<Backend> Backend::shrink(const BackendContext&) {
  return nullptr;
}

namespace {

[[noreturn]] void unsupported(const Backend& backend, OpType op, const OpContext& ctx) {
  throw Error(ErrorCode::kUnavailable, ctx.description() + ": backend '" + backend.name() +
                                           "' does not support '" + to_string(op) + "'");
}

// The tag of the message from rank src to rank dst inside a collective built from batch_p2p:
// the op's tag (its sequence number and signature), the pair and the message's size, so it
// meets only its match (a block of another size never meets it: it times out instead).
uint32_t message_tag(const OpContext& ctx, int src, int dst, size_t bytes) {
  return detail::WordMix()
      .mix(ctx.tag)
      .mix(static_cast<uint64_t>(src))
      .mix(static_cast<uint64_t>(dst))
      .mix(bytes)
      .folded();
}

// The defaults below copy a rank's own block on the host: they serve CPU backends, and device
// backends override them.
void copy_block(const TensorView& to, const TensorView& from) {
  if (to.nbytes() != 0 && to.data() != from.data())
    std::memcpy(to.data(), from.data(), to.nbytes());
}

// A batch of the messages of one collective; empty messages are left out on both sides.
class Messages {
 public:
  explicit Messages(const OpContext& ctx) : ctx_(ctx) {}
  void send(const TensorView& t, int dst) { add(P2POp::Kind::kSend, t, dst, ctx_.rank, dst); }
  void recv(const TensorView& t, int src) { add(P2POp::Kind::kRecv, t, src, src, ctx_.rank); }
  Backend::WorkPtr post(Backend& backend, const OpOptions& opts) const {
    if (requests_.empty()) return nullptr;
    BatchP2POptions batch;
    static_cast<OpOptions&>(batch) = opts;
    return backend.batch_p2p(requests_, batch, ctx_);
  }

 private:
  void add(P2POp::Kind kind, const TensorView& t, int peer, int src, int dst) {
    if (t.numel() == 0) return;
    P2PRequest r;
    r.kind = kind;
    r.tensor = t;
    r.peer = peer;
    r.seq = ctx_.seq;
    r.tag = message_tag(ctx_, src, dst, t.nbytes());
    requests_.push_back(std::move(r));
  }
  const OpContext& ctx_;
  std::vector<P2PRequest> requests_;
};

}  // namespace

Backend::WorkPtr Backend::broadcast(const std::vector<TensorView>&, const BroadcastOptions&,
                                    const OpContext& ctx) {
  unsupported(*this, OpType::kBroadcast, ctx);
}
Backend::WorkPtr Backend::allreduce(const std::vector<TensorView>&, const AllreduceOptions&,
                                    const OpContext& ctx) {
  unsupported(*this, OpType::kAllreduce, ctx);
}
Backend::WorkPtr Backend::reduce(const std::vector<TensorView>&, const ReduceOptions&,
                                 const OpContext& ctx) {
  unsupported(*this, OpType::kReduce, ctx);
}
Backend::WorkPtr Backend::allgather(const std::vector<std::vector<TensorView>>&,
                                    const std::vector<TensorView>&, const AllgatherOptions&,
                                    const OpContext& ctx) {
  unsupported(*this, OpType::kAllgather, ctx);
}
Backend::WorkPtr Backend::reduce_scatter(const std::vector<TensorView>&,
                                         const std::vector<std::vector<TensorView>>&,
                                         const ReduceScatterOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kReduceScatter, ctx);
}
Backend::WorkPtr Backend::barrier(const BarrierOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kBarrier, ctx);
}
Backend::WorkPtr Backend::send(const std::vector<TensorView>&, int, const SendOptions&,
                               const OpContext& ctx) {
  unsupported(*this, OpType::kSend, ctx);
}
Backend::WorkPtr Backend::recv(const std::vector<TensorView>&, int, const RecvOptions&,
                               const OpContext& ctx) {
  unsupported(*this, OpType::kRecv, ctx);
}
Backend::WorkPtr Backend::batch_p2p(const std::vector<P2PRequest>&, const BatchP2POptions&,
                                    const OpContext& ctx) {
  unsupported(*this, OpType::kBatchP2P, ctx);
}

Backend::WorkPtr Backend::allgather_into(const TensorView& output, const TensorView& input,
                                         const AllgatherOptions& opts, const OpContext& ctx) {
  std::vector<TensorView> parts;
  for (int r = 0; r < ctx.world_size; ++r) {
    parts.push_back(output.slice(r * input.numel(), input.numel()));
  }
  return allgather({parts}, {input}, opts, ctx);
}

Backend::WorkPtr Backend::reduce_scatter_from(const TensorView& output, const TensorView& input,
                                              const ReduceScatterOptions& opts,
                                              const OpContext& ctx) {
  std::vector<TensorView> parts;
  for (int r = 0; r < ctx.world_size; ++r) {
    parts.push_back(input.slice(r * output.numel(), output.numel()));
  }
  return reduce_scatter({output}, {parts}, opts, ctx);
}

Backend::WorkPtr Backend::alltoall(const std::vector<TensorView>& outputs,
                                   const std::vector<TensorView>& inputs,
                                   const AlltoallOptions& opts, const OpContext& ctx) {
  Messages m(ctx);
  // Peers in the order rank+1, rank+2, ...: each pair's messages are posted at once anyway, and
  // staggering spreads the first bytes over every link.
  for (int k = 1; k < ctx.world_size; ++k) {
    const int to = (ctx.rank + k) % ctx.world_size;
    const int from = (ctx.rank - k + ctx.world_size) % ctx.world_size;
    m.send(inputs[to], to);
    m.recv(outputs[from], from);
  }
  copy_block(outputs[ctx.rank], inputs[ctx.rank]);
  return m.post(*this, opts);
}

Backend::WorkPtr Backend::alltoall_base(const TensorView& output, const TensorView& input,
                                        const std::vector<int64_t>& output_counts,
                                        const std::vector<int64_t>& input_counts,
                                        const AlltoallOptions& opts, const OpContext& ctx) {
  std::vector<TensorView> outs, ins;
  int64_t out_at = 0, in_at = 0;
  for (int r = 0; r < ctx.world_size; ++r) {
    outs.push_back(output.slice(out_at, output_counts[r]));
    ins.push_back(input.slice(in_at, input_counts[r]));
    out_at += output_counts[r];
    in_at += input_counts[r];
  }
  return alltoall(outs, ins, opts, ctx);
}

Backend::WorkPtr Backend::allgatherv(const TensorView& output, const TensorView& input,
                                     const std::vector<int64_t>& counts,
                                     const AllgathervOptions& opts, const OpContext& ctx) {
  Messages m(ctx);
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
  for (int k = 1; k < ctx.world_size; ++k) {
    const int to = (ctx.rank + k) % ctx.world_size;
    const int from = (ctx.rank - k + ctx.world_size) % ctx.world_size;
    m.send(input, to);
    m.recv(output.slice(offsets[from], counts[from]), from);
  }
  copy_block(output.slice(offsets[ctx.rank], counts[ctx.rank]), input);
  return m.post(*this, opts);
}

Backend::WorkPtr Backend::gather(const std::vector<TensorView>& outputs, const TensorView& input,
                                 const GatherOptions& opts, const OpContext& ctx) {
  Messages m(ctx);
  if (ctx.rank == opts.root_rank) {
    for (int r = 0; r < ctx.world_size; ++r) {
      if (r != ctx.rank) m.recv(outputs[r], r);
    }
    copy_block(outputs[ctx.rank], input);
  } else {
    m.send(input, opts.root_rank);
  }
  return m.post(*this, opts);
}

Backend::WorkPtr Backend::scatter(const TensorView& output, const std::vector<TensorView>& inputs,
                                  const ScatterOptions& opts, const OpContext& ctx) {
  Messages m(ctx);
  if (ctx.rank == opts.root_rank) {
    for (int r = 0; r < ctx.world_size; ++r) {
      if (r != ctx.rank) m.send(inputs[r], r);
    }
    copy_block(output, inputs[ctx.rank]);
  } else {
    m.recv(output, opts.root_rank);
  }
  return m.post(*this, opts);
}

}  // namespace tutti
