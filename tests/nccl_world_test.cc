// The NCCL backend at world sizes 1, 2 and 4, each rank a process driving 1 to 4 GPUs: every
// collective with every dtype and reduce op (values checked against reference.h, computed
// independently), the single-tensor and the multi-GPU list forms, contiguous and separate
// output and input lists, in-place single buffers, point-to-point between every rank's devices,
// batched point-to-point (a ring and an all-pairs exchange, over every device; batched messages
// meeting plain ones), async ops through the group API, an op ordered after a delayed caller
// stream, synchronize covering an op on an explicit stream, a message larger than any internal
// chunk, and barrier. alltoall (list, single buffer, alltoallv), allgatherv, gather and scatter
// take one device per process (the group's API has no device-list form of them): they run, with
// every dtype, when each process drives one GPU. Rank r drives GPUs r x devices ...
// r x devices + devices - 1. NcclSplit splits four ranks into two pairs that run ops side by side.
//
// Runs on real GPUs (label "gpu", skipping without world x devices of them) and on the stand-in
// (label "standin"), where it also checks that nothing of the CUDA runtime or NCCL is leaked.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "nccl_test_util.h"

namespace tutti::testing {
namespace {

const DType kDTypes[] = {DType::kBool,     DType::kInt8,    DType::kUInt8,  DType::kInt32,
                         DType::kUInt32,   DType::kInt64,   DType::kUInt64, DType::kFloat16,
                         DType::kBFloat16, DType::kFloat32, DType::kFloat64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kAvg};

// One rank of the job: its group, its devices, and one check per op.
class Rank {
 public:
  Rank(std::shared_ptr<CollectiveGroup> g, int rank, int world, int devices)
      : g_(std::move(g)), rank_(rank), world_(world), k_(devices) {}

  void run() {
    int index = 0;
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(to_string(dtype));
      const bool contiguous = index % 2 == 0;
      const int root = index % world_;
      const int root_tensor = index % k_;
      ++index;
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
        SCOPED_TRACE(to_string(op));
        allreduce(dtype, op, kCount);
        reduce(dtype, op, root, root_tensor);
        reduce_scatter(dtype, op, contiguous);
      }
      broadcast(dtype, root, root_tensor);
      allgather(dtype, contiguous);
      if (k_ == 1) {
        alltoall(dtype, contiguous);
        alltoallv(dtype);
        allgatherv(dtype, /*in_place=*/contiguous);
        gather(dtype, root, contiguous);
        scatter(dtype, root, contiguous);
        in_place_single_buffers(dtype);
      }
    }
    // Larger than any chunk an implementation moves at once (the stand-in's channels: 64 KiB).
    allreduce(DType::kFloat32, ReduceOp::kSum, 100003);
    if (world_ > 1) {
      send_recv();
      batch_ring();
      batch_all_pairs();
      batched_meet_plain();
    }
    if (k_ == 1) async_ops();
    if (k_ == 1) {
      ordered_after_a_delayed_stream();
      synchronize_waits_for_an_explicit_stream();
    }
    // Barrier follows the devices of the last collective, whatever GPU is current: here rank
    // 0's current GPU is another rank's, the other ranks' their own.
    if (rank_ == 0) cudaSetDevice(k_ % nranks());
    g_->barrier();
  }

 private:
  static constexpr int64_t kCount = 37;

  int global(int d) const { return rank_ * k_ + d; }  // the NCCL rank of local device d
  int nranks() const { return world_ * k_; }
  std::string where(const char* op, int d) const {
    return std::string(op) + " on rank " + std::to_string(rank_) + " device " + std::to_string(d);
  }

  std::vector<std::unique_ptr<DeviceBuffer>> buffers(DType dtype, int64_t n) const {
    std::vector<std::unique_ptr<DeviceBuffer>> out;
    for (int d = 0; d < k_; ++d) {
      out.push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
    }
    return out;
  }
  static std::vector<TensorView> views(const std::vector<std::unique_ptr<DeviceBuffer>>& b,
                                       DType dtype, int64_t n) {
    std::vector<TensorView> out;
    for (const auto& x : b) out.push_back(x->view(dtype, n));
    return out;
  }

  void allreduce(DType dtype, ReduceOp op, int64_t n) {
    auto b = buffers(dtype, n);
    for (int d = 0; d < k_; ++d) {
      b[d]->fill(dtype, n,
                 [&](int64_t i) { return input_value(op, dtype, global(d), nranks(), i); });
    }
    AllreduceOptions o;
    o.reduce_op = op;
    if (k_ == 1) {
      g_->allreduce(b[0]->view(dtype, n), o);
    } else {
      g_->allreduce_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(
          dtype, b[d]->read(dtype, n),
          [&](int64_t i) { return expected_reduction(op, dtype, nranks(), i); },
          where("allreduce", d));
    }
  }

  void reduce(DType dtype, ReduceOp op, int root, int root_tensor) {
    const int64_t n = kCount;
    auto b = buffers(dtype, n);
    auto input = [&](int d) {
      return [=](int64_t i) { return input_value(op, dtype, global(d), nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) b[d]->fill(dtype, n, input(d));
    ReduceOptions o;
    o.reduce_op = op;
    o.root_rank = root;
    o.root_tensor = root_tensor;
    if (k_ == 1) {
      g_->reduce(b[0]->view(dtype, n), o);
    } else {
      g_->reduce_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      if (rank_ == root && d == root_tensor) {
        expect_values(
            dtype, b[d]->read(dtype, n),
            [&](int64_t i) { return expected_reduction(op, dtype, nranks(), i); },
            where("reduce (root)", d));
      } else {
        expect_values(dtype, b[d]->read(dtype, n), input(d), where("reduce (not root)", d));
      }
    }
  }

  void broadcast(DType dtype, int root, int root_tensor) {
    const int64_t n = kCount;
    auto b = buffers(dtype, n);
    auto value = [&](int g) {
      return [=](int64_t i) { return input_value(ReduceOp::kMax, dtype, g, nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) b[d]->fill(dtype, n, value(global(d)));
    BroadcastOptions o;
    o.root_rank = root;
    o.root_tensor = root_tensor;
    if (k_ == 1) {
      g_->broadcast(b[0]->view(dtype, n), o);
    } else {
      g_->broadcast_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(dtype, b[d]->read(dtype, n), value(root * k_ + root_tensor),
                    where("broadcast", d));
    }
  }

  // Outputs: per device, nranks() blocks, either back to back in one buffer or one buffer each.
  void allgather(DType dtype, bool contiguous) {
    const int64_t n = kCount;
    auto in = buffers(dtype, n);
    auto value = [&](int g) {
      return [=](int64_t i) { return input_value(ReduceOp::kMax, dtype, g, nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) in[d]->fill(dtype, n, value(global(d)));
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> out(k_);
    std::vector<std::vector<TensorView>> lists(k_);
    for (int d = 0; d < k_; ++d) {
      for (int g = 0; g < nranks(); ++g) {
        if (contiguous && g == 0) {
          out[d].push_back(
              std::make_unique<DeviceBuffer>(global(d), nranks() * n * dtype_size(dtype)));
        } else if (!contiguous) {
          out[d].push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
        }
        lists[d].push_back(contiguous ? out[d][0]->view(dtype, n, g * n)
                                      : out[d][g]->view(dtype, n));
      }
    }
    if (k_ == 1 && contiguous) {
      g_->allgather(out[0][0]->view(dtype, nranks() * n), in[0]->view(dtype, n));
    } else if (k_ == 1) {
      g_->allgather(lists[0], in[0]->view(dtype, n));
    } else {
      g_->allgather_multigpu(lists, views(in, dtype, n));
    }
    for (int d = 0; d < k_; ++d) {
      for (int g = 0; g < nranks(); ++g) {
        const auto got = contiguous ? out[d][0]->read(dtype, n, g * n) : out[d][g]->read(dtype, n);
        expect_values(dtype, got, value(g), where("allgather", d) + " block " + std::to_string(g));
      }
    }
  }

  // Inputs: per device, nranks() blocks (block g goes to NCCL rank g), back to back or separate.
  void reduce_scatter(DType dtype, ReduceOp op, bool contiguous) {
    const int64_t n = kCount;
    auto out = buffers(dtype, n);
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> in(k_);
    std::vector<std::vector<TensorView>> lists(k_);
    for (int d = 0; d < k_; ++d) {
      auto block = [&](int g) {
        return [=](int64_t i) { return input_value(op, dtype, global(d), nranks(), g * n + i); };
      };
      for (int g = 0; g < nranks(); ++g) {
        if (contiguous && g == 0) {
          in[d].push_back(
              std::make_unique<DeviceBuffer>(global(d), nranks() * n * dtype_size(dtype)));
        } else if (!contiguous) {
          in[d].push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
        }
        DeviceBuffer& buf = contiguous ? *in[d][0] : *in[d][g];
        buf.fill(dtype, n, block(g), contiguous ? g * n : 0);
        lists[d].push_back(contiguous ? buf.view(dtype, n, g * n) : buf.view(dtype, n));
      }
    }
    ReduceScatterOptions o;
    o.reduce_op = op;
    if (k_ == 1 && contiguous) {
      g_->reduce_scatter(out[0]->view(dtype, n), in[0][0]->view(dtype, nranks() * n), o);
    } else if (k_ == 1) {
      g_->reduce_scatter(out[0]->view(dtype, n), lists[0], o);
    } else {
      g_->reduce_scatter_multigpu(views(out, dtype, n), lists, o);
    }
    for (int d = 0; d < k_; ++d) {
      const int64_t base = global(d) * n;
      expect_values(
          dtype, out[d]->read(dtype, n),
          [&](int64_t i) { return expected_reduction(op, dtype, nranks(), base + i); },
          where("reduce_scatter", d));
    }
  }

  // Around a ring: device s of rank r sends to device (s + 1) % k of rank r + 1. Even ranks send
  // first, odd ranks receive first, and both ends take the devices in the same order, so the
  // two-rank communicators of every pair meet without a cycle.
  void send_recv() {
    const DType dtype = DType::kInt32;
    const int64_t n = 1000;
    const int next = (rank_ + 1) % world_;
    const int prev = (rank_ + world_ - 1) % world_;
    auto value = [&](int from_rank, int from_device) {
      return [=](int64_t i) {
        return static_cast<double>(from_rank * 1000 + from_device * 100 + i % 97);
      };
    };
    auto out = buffers(dtype, n);
    auto in = buffers(dtype, n);
    for (int d = 0; d < k_; ++d) out[d]->fill(dtype, n, value(rank_, d));
    auto sends = [&] {
      for (int s = 0; s < k_; ++s) {
        SendOptions o;
        o.dst_device_index = next * k_ + (s + 1) % k_;  // a CUDA device index of that process
        g_->send_multigpu(out[s]->view(dtype, n), next, 0, o);
      }
    };
    auto recvs = [&] {
      for (int s = 0; s < k_; ++s) {
        RecvOptions o;
        o.src_device_index = prev * k_ + s;
        g_->recv_multigpu(in[(s + 1) % k_]->view(dtype, n), prev, 0, o);
      }
    };
    if (rank_ % 2 == 0) {
      sends();
      recvs();
    } else {
      recvs();
      sends();
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(dtype, in[d]->read(dtype, n), value(prev, (d + k_ - 1) % k_), where("recv", d));
    }
  }

  // The value rank `from` sends to rank `to` (element i of the block): every block differs.
  static double block_value(int from, int to, int64_t i) {
    return static_cast<double>((from * 7 + to * 3 + i) % 11);
  }

  // inputs[p] goes to rank p: either views of one buffer (alltoall of single buffers) or one
  // buffer each (the list form).
  void alltoall(DType dtype, bool single) {
    const int64_t n = 5;
    DeviceBuffer in(global(0), world_ * n * dtype_size(dtype));
    DeviceBuffer out(global(0), world_ * n * dtype_size(dtype));
    for (int p = 0; p < world_; ++p) {
      in.fill(
          dtype, n, [&](int64_t i) { return block_value(rank_, p, i); }, p * n);
    }
    if (single) {
      g_->alltoall(out.view(dtype, world_ * n), in.view(dtype, world_ * n));
    } else {
      std::vector<TensorView> ins, outs;
      for (int p = 0; p < world_; ++p) {
        ins.push_back(in.view(dtype, n, p * n));
        outs.push_back(out.view(dtype, n, p * n));
      }
      g_->alltoall(outs, ins);
    }
    for (int p = 0; p < world_; ++p) {
      expect_values(
          dtype, out.read(dtype, n, p * n), [&](int64_t i) { return block_value(p, rank_, i); },
          where(single ? "alltoall (single buffers)" : "alltoall (lists)", 0) +
              " block from rank " + std::to_string(p));
    }
  }

  // Rank a sends (a + b) % 3 elements to rank b: some blocks are empty, the own one included.
  void alltoallv(DType dtype) {
    auto count = [](int a, int b) { return static_cast<int64_t>((a + b) % 3); };
    std::vector<int64_t> in_counts, out_counts;
    int64_t in_total = 0, out_total = 0;
    for (int p = 0; p < world_; ++p) {
      in_counts.push_back(count(rank_, p));
      out_counts.push_back(count(p, rank_));
      in_total += in_counts.back();
      out_total += out_counts.back();
    }
    DeviceBuffer in(global(0), (in_total + 1) * dtype_size(dtype));
    DeviceBuffer out(global(0), (out_total + 1) * dtype_size(dtype));
    int64_t at = 0;
    for (int p = 0; p < world_; ++p) {
      in.fill(
          dtype, in_counts[p], [&](int64_t i) { return block_value(rank_, p, i); }, at);
      at += in_counts[p];
    }
    g_->alltoallv(out.view(dtype, out_total), in.view(dtype, in_total), out_counts, in_counts);
    at = 0;
    for (int p = 0; p < world_; ++p) {
      expect_values(
          dtype, out.read(dtype, out_counts[p], at),
          [&](int64_t i) { return block_value(p, rank_, i); },
          where("alltoallv", 0) + " block from rank " + std::to_string(p));
      at += out_counts[p];
    }
  }

  // Rank r contributes (2r + 3) % 5 elements (rank 1 none), in place (the input is the rank's
  // own block of the output) or from a buffer of its own.
  void allgatherv(DType dtype, bool in_place) {
    std::vector<int64_t> counts, offsets;
    int64_t total = 0;
    for (int r = 0; r < world_; ++r) {
      counts.push_back((2 * r + 3) % 5);
      offsets.push_back(total);
      total += counts.back();
    }
    auto value = [&](int r) { return [=](int64_t i) { return block_value(r, r, i); }; };
    DeviceBuffer out(global(0), (total + 1) * dtype_size(dtype));
    DeviceBuffer own(global(0), (counts[rank_] + 1) * dtype_size(dtype));
    TensorView input = own.view(dtype, counts[rank_]);
    if (in_place && counts[rank_] > 0) {
      out.fill(dtype, counts[rank_], value(rank_), offsets[rank_]);
      input = out.view(dtype, counts[rank_], offsets[rank_]);
    } else {
      own.fill(dtype, counts[rank_], value(rank_));
    }
    g_->allgatherv(out.view(dtype, total), input, counts);
    for (int r = 0; r < world_; ++r) {
      expect_values(dtype, out.read(dtype, counts[r], offsets[r]), value(r),
                    where(in_place ? "allgatherv (in place)" : "allgatherv", 0) +
                        " block of rank " + std::to_string(r));
    }
  }

  void gather(DType dtype, int root, bool single) {
    const int64_t n = 7;
    DeviceBuffer in(global(0), n * dtype_size(dtype));
    DeviceBuffer out(global(0), world_ * n * dtype_size(dtype));
    in.fill(dtype, n, [&](int64_t i) { return block_value(rank_, root, i); });
    out.fill(dtype, world_ * n, [](int64_t) { return 0.0; });
    GatherOptions o;
    o.root_rank = root;
    if (single) {
      g_->gather(out.view(dtype, world_ * n), in.view(dtype, n), o);
    } else {
      std::vector<TensorView> outs;
      for (int r = 0; r < world_; ++r) outs.push_back(out.view(dtype, n, r * n));
      g_->gather(rank_ == root ? outs : std::vector<TensorView>{}, in.view(dtype, n), o);
    }
    for (int r = 0; r < world_; ++r) {
      expect_values(
          dtype, out.read(dtype, n, r * n),
          [&](int64_t i) { return rank_ == root ? block_value(r, root, i) : 0.0; },
          where(single ? "gather (single buffer)" : "gather (list)", 0) + " block " +
              std::to_string(r) + (rank_ == root ? " at the root" : " off the root"));
    }
  }

  void scatter(DType dtype, int root, bool single) {
    const int64_t n = 6;
    DeviceBuffer in(global(0), world_ * n * dtype_size(dtype));
    DeviceBuffer out(global(0), n * dtype_size(dtype));
    for (int r = 0; r < world_; ++r) {
      in.fill(
          dtype, n, [&](int64_t i) { return block_value(rank_, r, i); }, r * n);
    }
    ScatterOptions o;
    o.root_rank = root;
    if (single) {
      g_->scatter(out.view(dtype, n), in.view(dtype, world_ * n), o);
    } else {
      std::vector<TensorView> ins;
      for (int r = 0; r < world_; ++r) ins.push_back(in.view(dtype, n, r * n));
      g_->scatter(out.view(dtype, n), rank_ == root ? ins : std::vector<TensorView>{}, o);
    }
    expect_values(
        dtype, out.read(dtype, n), [&](int64_t i) { return block_value(root, rank_, i); },
        where(single ? "scatter (single buffer)" : "scatter (list)", 0));
  }

  // allgather and reduce_scatter of single buffers in place (NCCL's own in-place forms): the
  // input is this rank's block of the output, the output this rank's block of the input.
  void in_place_single_buffers(DType dtype) {
    const int64_t n = 9;
    auto value = [&](int r) {
      return [=](int64_t i) { return input_value(ReduceOp::kMax, dtype, r, world_, i); };
    };
    DeviceBuffer gathered(global(0), world_ * n * dtype_size(dtype));
    gathered.fill(dtype, n, value(rank_), rank_ * n);
    g_->allgather(gathered.view(dtype, world_ * n), gathered.view(dtype, n, rank_ * n));
    for (int r = 0; r < world_; ++r) {
      expect_values(dtype, gathered.read(dtype, n, r * n), value(r),
                    where("allgather in place", 0) + " block " + std::to_string(r));
    }
    DeviceBuffer reduced(global(0), world_ * n * dtype_size(dtype));
    reduced.fill(dtype, world_ * n,
                 [&](int64_t i) { return input_value(ReduceOp::kSum, dtype, rank_, world_, i); });
    g_->reduce_scatter(reduced.view(dtype, n, rank_ * n), reduced.view(dtype, world_ * n));
    expect_values(
        dtype, reduced.read(dtype, n, rank_ * n),
        [&](int64_t i) { return expected_reduction(ReduceOp::kSum, dtype, world_, rank_ * n + i); },
        where("reduce_scatter in place", 0));
  }

  // The value device `d` of rank `r` sends to rank `to` in the batched exchanges.
  static double batch_value(int r, int d, int to, int64_t i) {
    return static_cast<double>(r * 1000 + d * 100 + to * 10 + i % 7);
  }

  // A P2POp on local device d to the same device of `peer`: named explicitly when a process
  // drives several devices, left to the peer (kPeerDevice, the default) when it drives one.
  P2POp p2p(P2POp::Kind kind, const TensorView& t, int peer, int d) const {
    P2POp op = kind == P2POp::Kind::kSend ? P2POp::send(t, peer) : P2POp::recv(t, peer);
    if (k_ > 1) op.peer_device_index = peer * k_ + d;
    return op;
  }

  // Every device of every rank sends to the same device of the next rank and receives from the
  // previous one, all in one batch: a cycle that plain blocking sends would deadlock on.
  void batch_ring() {
    const DType dtype = DType::kInt64;
    const int64_t n = 3000;
    const int next = (rank_ + 1) % world_;
    const int prev = (rank_ + world_ - 1) % world_;
    auto out = buffers(dtype, n);
    auto in = buffers(dtype, n);
    std::vector<P2POp> ops;
    for (int d = 0; d < k_; ++d) {
      out[d]->fill(dtype, n, [&](int64_t i) { return batch_value(rank_, d, next, i); });
      ops.push_back(p2p(P2POp::Kind::kSend, out[d]->view(dtype, n), next, d));
      ops.push_back(p2p(P2POp::Kind::kRecv, in[d]->view(dtype, n), prev, d));
    }
    g_->batch_isend_irecv(ops)->wait();
    for (int d = 0; d < k_; ++d) {
      expect_values(
          dtype, in[d]->read(dtype, n), [&](int64_t i) { return batch_value(prev, d, rank_, i); },
          where("batch_isend_irecv ring", d));
    }
  }

  // Device 0 of every rank exchanges a block with device 0 of every other rank, in one batch
  // whose receives come first (any order must do).
  void batch_all_pairs() {
    const DType dtype = DType::kFloat32;
    const int64_t n = 500;
    std::vector<std::unique_ptr<DeviceBuffer>> out, in;
    std::vector<P2POp> recvs, sends;
    for (int p = 0; p < world_; ++p) {
      out.push_back(std::make_unique<DeviceBuffer>(global(0), n * 4));
      in.push_back(std::make_unique<DeviceBuffer>(global(0), n * 4));
      if (p == rank_) continue;
      out[p]->fill(dtype, n, [&](int64_t i) { return batch_value(rank_, 0, p, i); });
      sends.push_back(p2p(P2POp::Kind::kSend, out[p]->view(dtype, n), p, 0));
      recvs.push_back(p2p(P2POp::Kind::kRecv, in[p]->view(dtype, n), p, 0));
    }
    recvs.insert(recvs.end(), sends.begin(), sends.end());
    BatchP2POptions o;
    o.blocking = true;
    g_->batch_isend_irecv(recvs, o);
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      expect_values(
          dtype, in[p]->read(dtype, n), [&](int64_t i) { return batch_value(p, 0, rank_, i); },
          where("batch_isend_irecv all pairs", 0) + " from rank " + std::to_string(p));
    }
  }

  // Ranks pair up (0-1, 2-3): the even one sends and receives in one batch, the odd one
  // receives, then sends, with plain calls. Each message meets its match whatever its form.
  void batched_meet_plain() {
    const DType dtype = DType::kInt32;
    const int64_t n = 800;
    const bool even = rank_ % 2 == 0;
    const int peer = even ? rank_ + 1 : rank_ - 1;
    if (peer >= world_) return;
    DeviceBuffer out(global(0), n * 4), in(global(0), n * 4);
    out.fill(dtype, n, [&](int64_t i) { return batch_value(rank_, 0, peer, i); });
    if (even) {
      g_->batch_isend_irecv({p2p(P2POp::Kind::kSend, out.view(dtype, n), peer, 0),
                             p2p(P2POp::Kind::kRecv, in.view(dtype, n), peer, 0)});
    } else if (k_ == 1) {
      g_->recv(in.view(dtype, n), peer);
      g_->send(out.view(dtype, n), peer);
    } else {
      RecvOptions r;
      r.src_device_index = peer * k_;
      g_->recv_multigpu(in.view(dtype, n), peer, 0, r);
      SendOptions s;
      s.dst_device_index = peer * k_;
      g_->send_multigpu(out.view(dtype, n), peer, 0, s);
    }
    expect_values(
        dtype, in.read(dtype, n), [&](int64_t i) { return batch_value(peer, 0, rank_, i); },
        where(even ? "batched recv of a plain send" : "plain recv of a batched send", 0));
  }

  // async_op through the group API: behind a caller stream held until the test looked, three ops
  // return at once with Works that are not yet complete; waiting for the last one (the stream runs
  // them in order) leaves all three complete, with the right values.
  void async_ops() {
    const DType dtype = DType::kFloat32;
    const int64_t n = 256;
    DeviceBuffer a(global(0), n * 4), gathered(global(0), world_ * n * 4);
    DeviceBuffer in(global(0), world_ * n * 4), out(global(0), world_ * n * 4);
    a.fill(dtype, n,
           [&](int64_t i) { return input_value(ReduceOp::kSum, dtype, rank_, world_, i); });
    for (int p = 0; p < world_; ++p) {
      in.fill(
          dtype, n, [&](int64_t i) { return block_value(rank_, p, i); }, p * n);
    }
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    // The stream is held until the test has looked (a 100 ms sleep here once: issuing the ops
    // under a sanitizer on a loaded machine may take longer).
    static std::atomic<bool> held;
    held = true;
    cudaLaunchHostFunc(
        s,
        [](void*) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (held && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        },
        nullptr);
    AllreduceOptions ar;
    ar.stream = s;
    ar.async_op = true;
    AllgatherOptions ag;
    ag.stream = s;
    ag.async_op = true;
    AlltoallOptions aa;
    aa.stream = s;
    aa.async_op = true;
    auto w1 = g_->allreduce(a.view(dtype, n), ar);
    auto w2 = g_->allgather(gathered.view(dtype, world_ * n), a.view(dtype, n), ag);
    auto w3 = g_->alltoall(out.view(dtype, world_ * n), in.view(dtype, world_ * n), aa);
    EXPECT_FALSE(w1->is_completed()) << "an async op finished before the stream it follows";
    held = false;
    w3->wait();
    EXPECT_TRUE(w1->is_completed());
    EXPECT_TRUE(w2->is_success());
    EXPECT_TRUE(w3->is_success());
    const auto sum = [&](int64_t i) {
      return expected_reduction(ReduceOp::kSum, dtype, world_, i);
    };
    expect_values(dtype, a.read(dtype, n), sum, where("async allreduce", 0));
    for (int r = 0; r < world_; ++r) {
      expect_values(
          dtype, gathered.read(dtype, n, r * n), sum,
          where("async allgather after the async allreduce", 0) + " block " + std::to_string(r));
      expect_values(
          dtype, out.read(dtype, n, r * n), [&](int64_t i) { return block_value(r, rank_, i); },
          where("async alltoall", 0) + " block from rank " + std::to_string(r));
    }
    cudaStreamDestroy(s);
  }

  // The caller's stream: a 100 ms pause, the input's upload, the allreduce, the download. An op
  // that did not wait for the stream's earlier work would reduce stale input.
  void ordered_after_a_delayed_stream() {
    const DType dtype = DType::kFloat32;
    const int64_t n = 4096;
    DeviceBuffer buf(global(0), n * 4);
    buf.fill(dtype, n, [](int64_t) { return -1.0; });
    float* host = nullptr;
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), n * 4), cudaSuccess);
    for (int64_t i = 0; i < n; ++i) {
      host[i] = static_cast<float>(input_value(ReduceOp::kSum, dtype, global(0), nranks(), i));
    }
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr);
    cudaMemcpyAsync(buf.data(), host, n * 4, cudaMemcpyHostToDevice, s);
    AllreduceOptions o;
    o.stream = s;
    g_->allreduce(buf.view(dtype, n), o);
    cudaMemcpyAsync(host, buf.data(), n * 4, cudaMemcpyDeviceToHost, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<double> got(host, host + n);
    expect_values(
        dtype, got,
        [&](int64_t i) { return expected_reduction(ReduceOp::kSum, dtype, nranks(), i); },
        where("allreduce after a delayed caller stream", 0));
    cudaStreamDestroy(s);
    cudaFreeHost(host);
  }

  // An op on an explicit (non-blocking) stream, held back 100 ms: synchronize(device) must wait
  // for it, although the device's default stream never waited for that stream.
  void synchronize_waits_for_an_explicit_stream() {
    const DType dtype = DType::kInt64;
    const int64_t n = 4096;
    DeviceBuffer buf(global(0), n * 8);
    buf.fill(dtype, n,
             [&](int64_t i) { return input_value(ReduceOp::kSum, dtype, global(0), nranks(), i); });
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr);
    AllreduceOptions o;
    o.stream = s;
    g_->allreduce(buf.view(dtype, n), o);
    g_->synchronize(Device::cuda(global(0)));
    expect_values(
        dtype, buf.read(dtype, n),
        [&](int64_t i) { return expected_reduction(ReduceOp::kSum, dtype, nranks(), i); },
        where("allreduce on an explicit stream, after synchronize", 0));
    cudaStreamDestroy(s);
  }

  std::shared_ptr<CollectiveGroup> g_;
  int rank_;
  int world_;
  int k_;
};

// The options of a child's group: the parent's store (TUTTI_NCCL_TEST_STORE) and `timeout`.
GroupOptions child_options(std::chrono::milliseconds timeout) {
  GroupOptions o;
  o.store_url = env_str("TUTTI_NCCL_TEST_STORE");
  o.timeout = timeout;
  return o;
}

TEST(NcclWorldChild, EveryOpAndDtype) {
  if (env_str("TUTTI_NCCL_TEST_STORE").empty()) {
    GTEST_SKIP() << "runs only as a child of NcclWorld.EveryOpAndDtype";
  }
  const int rank = env_int("TUTTI_NCCL_TEST_RANK", 0);
  const int world = env_int("TUTTI_NCCL_TEST_WORLD", 1);
  const int devices = env_int("TUTTI_NCCL_TEST_DEVICES", 1);
  {
    const GroupOptions o = child_options(std::chrono::seconds(60));
    auto g = CollectiveGroup::create(world, rank, "nccl", "world", o);
    Rank(g, rank, world, devices).run();
    g->destroy();
  }
  expect_standin_clean("after destroy");
  if (!::testing::Test::HasFailure()) std::printf("EVERY OP OK\n");
}

class NcclWorld : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(NcclWorld, EveryOpAndDtype) {
  const auto [world, devices] = GetParam();
  SKIP_WITHOUT_GPUS(world * devices);
  TempDir dir;
  const std::string tag = "world" + std::to_string(::getpid()) + "x" + std::to_string(world) + "x" +
                          std::to_string(devices);
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < world; ++r) {
    envs.push_back({"TUTTI_NCCL_TEST_RANK=" + std::to_string(r),
                    "TUTTI_NCCL_TEST_WORLD=" + std::to_string(world),
                    "TUTTI_NCCL_TEST_DEVICES=" + std::to_string(devices),
                    "TUTTI_NCCL_TEST_STORE=file://" + dir.path() + "/store",
                    "TUTTI_STANDIN_TAG=" + tag});
  }
  const auto results =
      run_children("NcclWorldChild.EveryOpAndDtype", envs, std::chrono::seconds(240));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("EVERY OP OK"), std::string::npos) << "rank " << r << ":\n"
                                                                        << results[r].output;
  }
  EXPECT_TRUE(standin_segments(tag).empty()) << "shared-memory segments left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclWorld,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_devices" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Four ranks split into two pairs ({0, 1} and {2, 3}; every rank takes part in both splits and
// gets null for the other pair's), which run ops side by side; then the parent runs one again.
TEST(NcclSplitChild, FourRanksIntoPairs) {
  if (env_str("TUTTI_NCCL_TEST_STORE").empty()) {
    GTEST_SKIP() << "runs only as a child of NcclSplit.FourRanksIntoTwoPairs";
  }
  const int rank = env_int("TUTTI_NCCL_TEST_RANK", 0);
  {
    cudaSetDevice(rank);
    const GroupOptions o = child_options(std::chrono::seconds(60));
    auto g = CollectiveGroup::create(4, rank, "nccl", "world", o);
    const int64_t n = 1000;
    DeviceBuffer buf(rank, n * 4);
    buf.fill(DType::kFloat32, n, [](int64_t) { return 1.0; });
    g->allreduce(buf.view(DType::kFloat32, n));  // the parent has a communicator before the split
    auto low = g->split({0, 1});
    auto high = g->split({2, 3});
    ASSERT_EQ(low == nullptr, rank >= 2);
    ASSERT_EQ(high == nullptr, rank < 2);
    auto& pair = rank < 2 ? low : high;
    EXPECT_EQ(pair->backend_name(), "nccl");
    EXPECT_EQ(pair->world_size(), 2);
    EXPECT_EQ(pair->rank(), rank % 2);
    EXPECT_EQ(pair->global_rank(), rank);
    const int peer = rank ^ 1;
    // allreduce over the pair: (rank + 1) + (peer + 1).
    buf.fill(DType::kFloat32, n, [&](int64_t) { return rank + 1.0; });
    pair->allreduce(buf.view(DType::kFloat32, n));
    expect_values(
        DType::kFloat32, buf.read(DType::kFloat32, n), [&](int64_t) { return rank + peer + 2.0; },
        "allreduce in the pair");
    // alltoall of single buffers: block b of rank r holds 10 r + b.
    DeviceBuffer in(rank, 2 * n * 4), out(rank, 2 * n * 4);
    for (int b = 0; b < 2; ++b) {
      in.fill(
          DType::kInt32, n, [&](int64_t i) { return 10.0 * rank + b + (i % 5) * 100; }, b * n);
    }
    pair->alltoall(out.view(DType::kInt32, 2 * n), in.view(DType::kInt32, 2 * n));
    for (int b = 0; b < 2; ++b) {
      const int from = (rank & ~1) + b;
      expect_values(
          DType::kInt32, out.read(DType::kInt32, n, b * n),
          [&](int64_t i) { return 10.0 * from + rank % 2 + (i % 5) * 100; },
          "alltoall in the pair, block " + std::to_string(b));
    }
    // Point-to-point inside the pair, on each rank's own GPU (left to the peer to name).
    DeviceBuffer msg(rank, n * 8);
    if (rank % 2 == 0) {
      msg.fill(DType::kInt64, n, [&](int64_t i) { return rank * 10000.0 + i; });
      pair->send(msg.view(DType::kInt64, n), 1);
    } else {
      pair->recv(msg.view(DType::kInt64, n), 0);
      expect_values(
          DType::kInt64, msg.read(DType::kInt64, n), [&](int64_t i) { return peer * 10000.0 + i; },
          "recv in the pair");
    }
    pair->barrier();
    // The parent still works, over all four.
    buf.fill(DType::kFloat32, n, [&](int64_t) { return rank + 1.0; });
    g->allreduce(buf.view(DType::kFloat32, n));
    expect_values(
        DType::kFloat32, buf.read(DType::kFloat32, n), [](int64_t) { return 10.0; },
        "allreduce in the parent after the split");
    pair->destroy();
    g->destroy();
  }
  expect_standin_clean("after destroy");
  if (!::testing::Test::HasFailure()) std::printf("SPLIT OK\n");
}

// Runs `child` (a test of this binary) as four ranks through one file store: each must exit 0
// saying `ok`, and leave no stand-in segment behind.
// A rank listed in `killed` must instead have died of SIGKILL. `env` is added to each rank's.
void four_ranks_say(const std::string& child, const std::string& ok,
                    const std::vector<std::string>& env = {}, const std::vector<int>& killed = {}) {
  TempDir dir;
  const std::string tag = ok.substr(0, ok.find(' ')) + std::to_string(::getpid());
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < 4; ++r) {
    envs.push_back({"TUTTI_NCCL_TEST_RANK=" + std::to_string(r),
                    "TUTTI_NCCL_TEST_STORE=file://" + dir.path() + "/store",
                    "TUTTI_STANDIN_TAG=" + tag});
    envs.back().insert(envs.back().end(), env.begin(), env.end());
  }
  const auto results = run_children(child, envs, std::chrono::seconds(120));
  for (size_t r = 0; r < results.size(); ++r) {
    if (std::find(killed.begin(), killed.end(), static_cast<int>(r)) != killed.end()) {
      EXPECT_EQ(results[r].signal, SIGKILL) << "rank " << r << ":\n" << results[r].output;
      continue;
    }
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find(ok), std::string::npos) << "rank " << r << ":\n"
                                                             << results[r].output;
  }
  EXPECT_TRUE(standin_segments(tag).empty()) << "shared-memory segments left in /dev/shm";
}

TEST(NcclSplit, FourRanksIntoTwoPairs) {
  SKIP_WITHOUT_GPUS(4);
  four_ranks_say("NcclSplitChild.FourRanksIntoPairs", "SPLIT OK");
}

// How many communicators the stand-in NCCL made with ncclCommShrink in this process (-1 on a real
// NCCL, which does not count): TUTTI_NCCL_TEST_SHRINKS says how many a child expects (unset: not
// checked).
void expect_shrinks(const std::string& when) {
  const int got = standin::count("tutti_standin_nccl_shrinks");
  if (got < 0 || env_str("TUTTI_NCCL_TEST_SHRINKS").empty()) return;
  EXPECT_EQ(got, env_int("TUTTI_NCCL_TEST_SHRINKS", -1))
      << when << ": communicators made by ncclCommShrink (TUTTI_NCCL_SHRINK=0: none)";
}

// Four ranks; rank 3 leaves (destroys its group). The other three shrink without it into an NCCL
// group of three (by ncclCommShrink of the revoked communicator; with TUTTI_NCCL_SHRINK=0, a new
// communicator through the store), then grow back to four: rank 3's process joins as the new
// rank. Each group's allreduce counts who took part.
TEST(NcclShrinkChild, ShrinkThenGrowBack) {
  if (env_str("TUTTI_NCCL_TEST_STORE").empty()) {
    GTEST_SKIP() << "runs only as a child of NcclShrink.ThreeShrinkAndGrowBackToFour";
  }
  const int rank = env_int("TUTTI_NCCL_TEST_RANK", 0);
  {
    cudaSetDevice(rank);
    const GroupOptions o = child_options(std::chrono::seconds(60));
    auto g = CollectiveGroup::create(4, rank, "nccl", "world", o);
    const int64_t n = 1000;
    DeviceBuffer buf(rank, n * 4);
    auto sum_of_ranks = [&](CollectiveGroup& group, double want, const std::string& what) {
      buf.fill(DType::kFloat32, n, [&](int64_t) { return group.rank() + 1.0; });
      group.allreduce(buf.view(DType::kFloat32, n));
      expect_values(
          DType::kFloat32, buf.read(DType::kFloat32, n), [&](int64_t) { return want; }, what);
    };
    sum_of_ranks(*g, 10.0, "allreduce at world 4");
    std::shared_ptr<CollectiveGroup> grown;
    if (rank == 3) {
      g->destroy();
      grown = CollectiveGroup::join("world", o);
    } else {
      ShrinkOptions s;
      s.exclude = {3};
      auto small = g->shrink(s);
      g->destroy();
      EXPECT_EQ(small->backend_name(), "nccl");
      EXPECT_EQ(small->world_size(), 3);
      sum_of_ranks(*small, 6.0, "allreduce at world 3 after the shrink");
      expect_shrinks("after the shrink");
      grown = small->grow();
      small->destroy();
    }
    EXPECT_EQ(grown->backend_name(), "nccl");
    EXPECT_EQ(grown->world_size(), 4);
    EXPECT_EQ(grown->rank(), rank);
    sum_of_ranks(*grown, 10.0, "allreduce at world 4 after the grow");
    grown->destroy();
  }
  expect_standin_clean("after destroy");
  if (!::testing::Test::HasFailure()) std::printf("SHRINK OK\n");
}

TEST(NcclShrink, ThreeShrinkAndGrowBackToFour) {
  SKIP_WITHOUT_GPUS(4);
  four_ranks_say("NcclShrinkChild.ShrinkThenGrowBack", "SHRINK OK", {"TUTTI_NCCL_TEST_SHRINKS=1"});
}

TEST(NcclShrink, ThreeShrinkThroughNewCommunicatorsWhereNcclCannot) {
  SKIP_WITHOUT_GPUS(4);
  four_ranks_say("NcclShrinkChild.ShrinkThenGrowBack", "SHRINK OK",
                 {"TUTTI_NCCL_SHRINK=0", "TUTTI_NCCL_TEST_SHRINKS=0"});
}

// ncclCommShrink fails on one survivor (rank 1): all three abort what they shrank and make new
// communicators (nothing of the abandoned ones is left: expect_standin_clean), promptly (the
// others stop waiting for rank 1's part once it says it failed, not at the shrink's deadline).
TEST(NcclShrink, ASurvivorWhoseShrinkFailsMakesAllFallBack) {
  SKIP_WITHOUT_STANDIN();
  const auto start = std::chrono::steady_clock::now();
  four_ranks_say("NcclShrinkChild.ShrinkThenGrowBack", "SHRINK OK",
                 {"TUTTI_STANDIN_NCCL_SHRINK_ERROR=1"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "the group's timeout is 60 s: the survivors waited for the failed one's shrink";
}

// Four ranks run an allreduce loop; rank 2 is SIGKILLed in the middle of it. The other three
// fail at the step it never reached (their allreduce times out: NCCL cannot tell them), shrink
// naming no one (the dead process is seen by its pid), and finish the loop at world 3 with the
// right sums, on communicators NCCL shrank from the revoked ones.
TEST(NcclShrinkChild, KilledMidLoop) {
  if (env_str("TUTTI_NCCL_TEST_STORE").empty()) {
    GTEST_SKIP() << "runs only as a child of NcclShrink.SurvivorsOfAKillFinishTheLoop";
  }
  const int rank = env_int("TUTTI_NCCL_TEST_RANK", 0);
  {
    cudaSetDevice(rank);
    const GroupOptions o = child_options(std::chrono::seconds(3));
    auto g = CollectiveGroup::create(4, rank, "nccl", "world", o);
    std::shared_ptr<CollectiveGroup> group = g;
    const int64_t n = 4096;
    DeviceBuffer buf(rank, n * 4);
    int failures = 0;
    for (int step = 0; step < 20; ++step) {
      if (rank == 2 && step == 10) ::raise(SIGKILL);
      // Each rank adds (its rank in the world of four) + step: the sum says who took part.
      buf.fill(DType::kFloat32, n, [&](int64_t i) { return rank + step + (i % 7); });
      try {
        AllreduceOptions wait;
        wait.blocking = true;  // a GPU op's failure shows here, not at the next call
        group->allreduce(buf.view(DType::kFloat32, n), wait);
      } catch (const Error& e) {
        ++failures;
        ASSERT_EQ(failures, 1) << "a second failure: " << e.what();
        EXPECT_EQ(step, 10) << e.what();
        group = g->shrink(ShrinkOptions());
        EXPECT_EQ(group->backend_name(), "nccl");
        ASSERT_EQ(group->world_size(), 3);
        expect_shrinks("after the shrink");
        --step;  // again, at world 3
        continue;
      }
      const std::vector<int> members =
          group == g ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1, 3};
      expect_values(
          DType::kFloat32, buf.read(DType::kFloat32, n),
          [&](int64_t i) {
            double sum = 0;
            for (int m : members) sum += m + step + (i % 7);
            return sum;
          },
          "allreduce at step " + std::to_string(step));
    }
    EXPECT_EQ(failures, 1);
    if (group != g) group->destroy();
    g->destroy();
  }
  expect_standin_clean("after destroy");
  if (!::testing::Test::HasFailure()) std::printf("KILL OK\n");
}

TEST(NcclShrink, SurvivorsOfAKillFinishTheLoop) {
  SKIP_WITHOUT_GPUS(4);
  four_ranks_say("NcclShrinkChild.KilledMidLoop", "KILL OK", {"TUTTI_NCCL_TEST_SHRINKS=1"}, {2});
}

}  // namespace
}  // namespace tutti::testing
