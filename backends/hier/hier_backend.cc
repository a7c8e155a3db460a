#include "hier_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "gloo/gloo_backend.h"
#include "group/op_tags.h"
#include "tensor/reduction.h"
#include "tutti/error.h"
#include "tutti/prefix_store.h"
#include "util/deadline.h"
#include "util/logging.h"

namespace tutti::gloo_backend {
namespace {

using Clock = std::chrono::steady_clock;

// What a level's collective is named and tagged by.
OpSignature signature(OpType op, const TensorView& t, int root, int reduce_op) {
  return detail::signature_of(op, t, root, reduce_op);
}

}  // namespace

bool HierBackend::suits(const std::vector<std::string>& hosts) {
  std::map<std::string, int> ranks;
  for (const auto& h : hosts) ++ranks[h];
  if (ranks.size() < 2) return false;
  return std::any_of(ranks.begin(), ranks.end(), [](const auto& e) { return e.second > 1; });
}

HierBackend::HierBackend(const BackendContext& ctx) : world_(ctx.world_size) {
  if (static_cast<int>(ctx.hosts.size()) != ctx.world_size) {
    throw Error(ErrorCode::kInternal, "the hier backend needs every rank's host (got " +
                                          std::to_string(ctx.hosts.size()) + " for " +
                                          std::to_string(ctx.world_size) + " ranks)");
  }
  // Hosts numbered by first appearance; a host's leader is its lowest rank.
  std::vector<std::string> hosts;
  std::vector<std::vector<int>> members;
  host_of_.resize(world_);
  local_index_.resize(world_);
  for (int r = 0; r < world_; ++r) {
    auto it = std::find(hosts.begin(), hosts.end(), ctx.hosts[r]);
    const int h = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) {
      hosts.push_back(ctx.hosts[r]);
      members.emplace_back();
    }
    host_of_[r] = h;
    local_index_[r] = static_cast<int>(members[h].size());
    members[h].push_back(r);
  }
  host_ = host_of_[ctx.rank];

  // A level's context: its ranks' facts, its own keys in the group's store.
  auto level_context = [&](const std::vector<int>& ranks, const std::string& label) {
    BackendContext c;
    c.group_name = ctx.group_name + "/" + label;
    c.rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), ctx.rank) - ranks.begin());
    c.world_size = static_cast<int>(ranks.size());
    c.store = std::make_shared<PrefixStore>(label, ctx.store);
    c.timeout = ctx.timeout;
    c.instance = ctx.instance + "." + label;
    for (int r : ranks) {
      c.hosts.push_back(ctx.hosts[r]);
      c.pids.push_back(r < static_cast<int>(ctx.pids.size()) ? ctx.pids[r] : 0);
      c.global_ranks.push_back(r < static_cast<int>(ctx.global_ranks.size()) ? ctx.global_ranks[r]
                                                                             : r);
    }
    return c;
  };
  auto fill = [&](Level& level, const BackendContext& c, const std::vector<int>& ranks) {
    level.name = std::make_shared<const std::string>(c.group_name);
    level.rank = c.rank;
    level.world = c.world_size;
    std::string theirs, ours;
    for (size_t i = 0; i < ranks.size(); ++i) {
      theirs += (i == 0 ? "" : ", ") + std::to_string(i);
      ours += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
    }
    level.legend = "in '" + c.group_name + "', ranks " + theirs + " are ranks " + ours +
                   " of group '" + ctx.group_name + "'";
  };

  // Every member makes the levels in the same order (host, leaders, flat), and each level's
  // making waits only for its own members, so no two ranks wait on each other crosswise.
  // A level's failure to form says which level, and which of the group's ranks its ranks are.
  auto make = [&](Level& level, const BackendContext& c, const std::vector<int>& ranks,
                  const std::function<std::unique_ptr<Backend>()>& factory) {
    fill(level, c, ranks);
    try {
      level.backend = factory();
    } catch (const Error& e) {
      throw Error(e.code(),
                  "making level '" + c.group_name + "': " + e.what() + " (" + level.legend + ")");
    }
  };
  const std::vector<int>& mine = members[host_];
  local_ranks_ = mine;
  if (mine.size() > 1) {
    const BackendContext c = level_context(mine, "host" + std::to_string(host_));
    const std::string local = is_backend_available("shm") ? "shm" : "gloo";
    make(local_, c, mine, [&] { return create_collective_backend(local, c); });
  }
  if (hosts.size() > 1 && mine.front() == ctx.rank) {
    std::vector<int> leaders;
    for (const auto& m : members) leaders.push_back(m.front());
    const BackendContext c = level_context(leaders, "leaders");
    make(leaders_, c, leaders, [&] { return std::make_unique<GlooBackend>(c); });
  }
  std::vector<int> everyone(world_);
  for (int r = 0; r < world_; ++r) everyone[r] = r;
  Level flat;
  const BackendContext c = level_context(everyone, "flat");
  make(flat, c, everyone, [&] { return std::make_unique<GlooBackend>(c); });
  flat_ = std::move(flat.backend);
  TUTTI_LOG_DEBUG("hier: rank {}/{} on host {} of {} ({} rank(s) there{})", ctx.rank, world_, host_,
                  hosts.size(), mine.size(), leaders_.backend ? ", its leader" : "");
}

HierBackend::~HierBackend() = default;

namespace {

// The host level's region, seen by the whole group: the group hands every rank's descriptor to
// attach, which passes on this host's, in the host level's order. A rank alone on its host has
// ordinary memory (nothing to share), and says so with a placeholder descriptor.
class HierRegion : public SymmetricRegion {
 public:
  HierRegion(std::unique_ptr<SymmetricRegion> inner, size_t bytes, std::vector<int> local_ranks,
             std::string legend)
      : inner_(std::move(inner)),
        bytes_(bytes),
        local_ranks_(std::move(local_ranks)),
        legend_(std::move(legend)) {
    if (!inner_) {
      plain_.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      if (!plain_) {
        throw Error(ErrorCode::kUnavailable,
                    "hier: out of memory for " + std::to_string(bytes) + " bytes");
      }
      std::memset(plain_.get(), 0, (bytes + 63) / 64 * 64);
    }
  }
  void* data() const override { return inner_ ? inner_->data() : plain_.get(); }
  size_t size() const override { return bytes_; }
  std::string descriptor() const override { return inner_ ? inner_->descriptor() : "alone"; }
  void attach(const std::vector<std::string>& descriptors) override {
    if (!inner_) return;
    std::vector<std::string> local;
    for (int r : local_ranks_) local.push_back(descriptors.at(static_cast<size_t>(r)));
    try {
      inner_->attach(local);
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) + " (" + legend_ + ")");
    }
  }
  void commit(bool everyone) override {
    if (inner_) inner_->commit(everyone);
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<SymmetricRegion> inner_;
  std::unique_ptr<char, Free> plain_;
  size_t bytes_;
  std::vector<int> local_ranks_;
  std::string legend_;  // which of the group's ranks the host level's are
};

}  // namespace

std::unique_ptr<SymmetricRegion> HierBackend::create_symmetric(size_t bytes) {
  // Host levels of gloo (shm not built) have none: then this rank has none, alone on its host
  // or not (the group's exchange then gives every rank ordinary memory).
  if (!is_backend_available("shm")) return nullptr;
  std::unique_ptr<SymmetricRegion> inner;
  if (local_.backend) inner = local_.backend->create_symmetric(bytes);
  return std::make_unique<HierRegion>(std::move(inner), bytes, local_ranks_, local_.legend);
}

template <typename Issue>
void HierBackend::run(Level& level, OpType op, const OpSignature& signature,
                      const OpContext& parent, Clock::time_point deadline, Issue&& issue) {
  OpContext c;
  c.op = op;
  c.seq = level.seq++;
  c.signature = signature;
  c.tag = detail::collective_tag(c.seq, signature.hash());
  c.group_name = level.name;
  c.rank = level.rank;
  c.world_size = level.world;
  // What is left of the parent op's time (at least a millisecond: the level then times out),
  // from now, which is also when the level's op starts (a level's backend looks at that: shm's
  // spin policy looks again every second of them).
  c.started = Clock::now();
  c.timeout = std::max(std::chrono::milliseconds(1), detail::time_left(deadline, c.started));
  try {
    WorkPtr work = issue(*level.backend, c);
    if (work) work->wait();
  } catch (const Error& e) {
    // A level's timeout is what was left of the op's when the level began: say the op's too.
    std::string whole;
    if (e.code() == ErrorCode::kTimeout && c.timeout != parent.timeout) {
      whole = "; the op's timeout is " + std::to_string(parent.timeout.count()) + " ms, of which " +
              std::to_string(c.timeout.count()) + " ms were left when this level began";
    }
    throw Error(e.code(),
                parent.description() + ": " + e.what() + " (" + level.legend + whole + ")");
  }
}

HierBackend::WorkPtr HierBackend::allreduce(const std::vector<TensorView>& tensors,
                                            const AllreduceOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors.at(0);
  const auto deadline = ctx.deadline();  // the whole op's: each level gets what is left
  // An average is a sum through the levels, divided once on each host.
  const bool average = opts.reduce_op == ReduceOp::kAvg;
  const ReduceOp op = average ? ReduceOp::kSum : opts.reduce_op;
  if (local_.backend) {
    ReduceOptions o;
    o.reduce_op = op;
    o.root_rank = 0;
    run(local_, OpType::kReduce, signature(OpType::kReduce, t, 0, static_cast<int>(op)), ctx,
        deadline, [&](Backend& b, const OpContext& c) { return b.reduce({t}, o, c); });
  }
  if (leaders_.backend) {
    AllreduceOptions o;
    o.reduce_op = op;
    run(leaders_, OpType::kAllreduce, signature(OpType::kAllreduce, t, -1, static_cast<int>(op)),
        ctx, deadline, [&](Backend& b, const OpContext& c) { return b.allreduce({t}, o, c); });
  }
  if (average && local_index_[ctx.rank] == 0) {
    detail::scale_average(t.data(), t.dtype(), static_cast<size_t>(t.numel()), world_);
  }
  if (local_.backend) {
    BroadcastOptions o;
    o.root_rank = 0;
    run(local_, OpType::kBroadcast, signature(OpType::kBroadcast, t, 0, -1), ctx, deadline,
        [&](Backend& b, const OpContext& c) { return b.broadcast({t}, o, c); });
  }
  return nullptr;
}

HierBackend::WorkPtr HierBackend::broadcast(const std::vector<TensorView>& tensors,
                                            const BroadcastOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors.at(0);
  const auto deadline = ctx.deadline();
  const int root_host = host_of_.at(opts.root_rank);
  // The root's host first (its leader then holds the data), then the leaders, then the others.
  if (local_.backend && host_ == root_host) {
    BroadcastOptions o;
    o.root_rank = local_index_[opts.root_rank];
    run(local_, OpType::kBroadcast, signature(OpType::kBroadcast, t, o.root_rank, -1), ctx,
        deadline, [&](Backend& b, const OpContext& c) { return b.broadcast({t}, o, c); });
  }
  if (leaders_.backend) {
    BroadcastOptions o;
    o.root_rank = root_host;
    run(leaders_, OpType::kBroadcast, signature(OpType::kBroadcast, t, root_host, -1), ctx,
        deadline, [&](Backend& b, const OpContext& c) { return b.broadcast({t}, o, c); });
  }
  if (local_.backend && host_ != root_host) {
    BroadcastOptions o;
    o.root_rank = 0;
    run(local_, OpType::kBroadcast, signature(OpType::kBroadcast, t, 0, -1), ctx, deadline,
        [&](Backend& b, const OpContext& c) { return b.broadcast({t}, o, c); });
  }
  return nullptr;
}

HierBackend::WorkPtr HierBackend::barrier(const BarrierOptions& opts, const OpContext& ctx) {
  // Every rank of a host has arrived, then every host, then every rank learns it.
  const auto deadline = ctx.deadline();
  OpSignature s;
  s.op = OpType::kBarrier;
  auto issue = [&](Backend& b, const OpContext& c) { return b.barrier(opts, c); };
  if (local_.backend) run(local_, OpType::kBarrier, s, ctx, deadline, issue);
  if (leaders_.backend) run(leaders_, OpType::kBarrier, s, ctx, deadline, issue);
  if (local_.backend) run(local_, OpType::kBarrier, s, ctx, deadline, issue);
  return nullptr;
}

HierBackend::WorkPtr HierBackend::reduce(const std::vector<TensorView>& tensors,
                                         const ReduceOptions& opts, const OpContext& ctx) {
  return flat_->reduce(tensors, opts, ctx);
}

HierBackend::WorkPtr HierBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                                            const std::vector<TensorView>& inputs,
                                            const AllgatherOptions& opts, const OpContext& ctx) {
  return flat_->allgather(outputs, inputs, opts, ctx);
}

HierBackend::WorkPtr HierBackend::allgather_into(const TensorView& output, const TensorView& input,
                                                 const AllgatherOptions& opts,
                                                 const OpContext& ctx) {
  return flat_->allgather_into(output, input, opts, ctx);
}

HierBackend::WorkPtr HierBackend::allgatherv(const TensorView& output, const TensorView& input,
                                             const std::vector<int64_t>& counts,
                                             const AllgathervOptions& opts, const OpContext& ctx) {
  return flat_->allgatherv(output, input, counts, opts, ctx);
}

HierBackend::WorkPtr HierBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                                 const std::vector<std::vector<TensorView>>& inputs,
                                                 const ReduceScatterOptions& opts,
                                                 const OpContext& ctx) {
  return flat_->reduce_scatter(outputs, inputs, opts, ctx);
}

HierBackend::WorkPtr HierBackend::reduce_scatter_from(const TensorView& output,
                                                      const TensorView& input,
                                                      const ReduceScatterOptions& opts,
                                                      const OpContext& ctx) {
  return flat_->reduce_scatter_from(output, input, opts, ctx);
}

HierBackend::WorkPtr HierBackend::alltoall(const std::vector<TensorView>& outputs,
                                           const std::vector<TensorView>& inputs,
                                           const AlltoallOptions& opts, const OpContext& ctx) {
  return flat_->alltoall(outputs, inputs, opts, ctx);
}

HierBackend::WorkPtr HierBackend::alltoall_base(const TensorView& output, const TensorView& input,
                                                const std::vector<int64_t>& output_counts,
                                                const std::vector<int64_t>& input_counts,
                                                const AlltoallOptions& opts, const OpContext& ctx) {
  return flat_->alltoall_base(output, input, output_counts, input_counts, opts, ctx);
}

HierBackend::WorkPtr HierBackend::gather(const std::vector<TensorView>& outputs,
                                         const TensorView& input, const GatherOptions& opts,
                                         const OpContext& ctx) {
  return flat_->gather(outputs, input, opts, ctx);
}

HierBackend::WorkPtr HierBackend::scatter(const TensorView& output,
                                          const std::vector<TensorView>& inputs,
                                          const ScatterOptions& opts, const OpContext& ctx) {
  return flat_->scatter(output, inputs, opts, ctx);
}

HierBackend::WorkPtr HierBackend::send(const std::vector<TensorView>& tensors, int dst_rank,
                                       const SendOptions& opts, const OpContext& ctx) {
  return flat_->send(tensors, dst_rank, opts, ctx);
}

HierBackend::WorkPtr HierBackend::recv(const std::vector<TensorView>& tensors, int src_rank,
                                       const RecvOptions& opts, const OpContext& ctx) {
  return flat_->recv(tensors, src_rank, opts, ctx);
}

HierBackend::WorkPtr HierBackend::batch_p2p(const std::vector<P2PRequest>& requests,
                                            const BatchP2POptions& opts, const OpContext& ctx) {
  return flat_->batch_p2p(requests, opts, ctx);
}

void HierBackend::abort(const std::string& reason) {
  if (local_.backend) local_.backend->abort(reason);
  if (leaders_.backend) leaders_.backend->abort(reason);
  if (flat_) flat_->abort(reason);
}

}  // namespace tutti::gloo_backend
