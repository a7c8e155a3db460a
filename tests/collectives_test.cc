// Every op x dtype x reduce op x size, at world sizes 1, 2, 3, 4 and 8, ranks as threads.
// Groups are created once per (world size, op) and reused across all cases of that test.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>

#include "reference.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

const DType kAllDTypes[] = {DType::kBool,     DType::kInt8,    DType::kUInt8,  DType::kInt32,
                            DType::kUInt32,   DType::kInt64,   DType::kUInt64, DType::kFloat16,
                            DType::kBFloat16, DType::kFloat32, DType::kFloat64};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg};
// Small sizes run for every dtype and reduce op; the large odd size runs once per dtype. 25
// elements: past the shm slot's 48-byte line for dtypes of 2 bytes and more, in 1-4 more lines
// (the payload that shm's exchange polls with its number, up to 256 B).
const int64_t kSmallSizes[] = {0, 1, 7, 25, 1000};
constexpr int64_t kLargeSize = (1 << 20) + 3;
// The ops that move a block per pair of ranks (alltoall and its kin) take a smaller large case:
// world^2 blocks of it cross the staging areas.
constexpr int64_t kLargeBlock = (1 << 16) + 3;
// allgather and reduce_scatter move world blocks of theirs per rank: a quarter of the large size
// keeps world 8 at 2M elements a rank (the full size made those two 80 s each under ASan).
constexpr int64_t kLargeGathered = (1 << 18) + 3;

struct Case {
  DType dtype;
  ReduceOp op;
  int64_t count;
  int root;
  std::string str() const {
    std::ostringstream s;
    s << to_string(dtype) << " " << to_string(op) << " count=" << count << " root=" << root;
    return s.str();
  }
};

// The sanitizer run (TUTTI_TEST_LIGHT=1, scripts/sanitize.sh) takes the large case for one dtype
// of each element size (1, 2, 4, 8 bytes): the chunked paths and their bounds are the same for
// dtypes of one size, and the large cases of all eleven were 58% of that run's test time. At
// world 8 it takes float32's only: worlds 2-4 run each element size through the same chunking,
// and the 24 world-8 cases took 52 s under ASan with four large cases each, 24 s with one. The
// plain run takes every one.
bool large_case_for(DType dtype, int world) {
  if (!light_test_run()) return true;
  if (world > 4) return dtype == DType::kFloat32;
  return dtype == DType::kUInt8 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kInt64;
}

std::vector<Case> cases(int world, bool reducing, int64_t large) {
  std::vector<Case> out;
  int n = 0;
  for (DType dtype : kAllDTypes) {
    std::vector<ReduceOp> ops;
    for (ReduceOp op : kAllOps) {
      if (!reducing && op != ReduceOp::kSum) continue;
      if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
      ops.push_back(op);
    }
    for (ReduceOp op : ops) {
      for (int64_t count : kSmallSizes) out.push_back({dtype, op, count, n++ % world});
    }
    // One large case per dtype, rotating through its reduce ops.
    if (large_case_for(dtype, world)) {
      out.push_back({dtype, ops[static_cast<size_t>(n) % ops.size()], large, n % world});
    }
    ++n;
  }
  return out;
}

using Buffer = std::vector<uint64_t>;  // 8-byte aligned storage for any dtype

Buffer make_buffer(DType dtype, int64_t count) {
  return Buffer((static_cast<size_t>(count) * dtype_size(dtype) + 7) / 8 + 1);
}

TensorView view(Buffer& b, DType dtype, int64_t count) {
  return TensorView(count == 0 ? nullptr : b.data(), dtype, {count});
}

// Reports the first mismatching element, if any.
void check(const Buffer& buf, const Case& c, int64_t count,
           const std::function<double(int64_t)>& want, const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    const double got = read_value(c.dtype, buf.data(), i);
    const double expected = as_dtype(c.dtype, want(i));
    if (got != expected) {
      ADD_FAILURE() << what << " " << c.str() << ": element " << i << " is " << got << ", expected "
                    << expected;
      return;
    }
  }
}

// What every runner is handed: the rank's group and one case.
struct OpRun {
  CollectiveGroup& g;
  const Case& c;
  int r;
  int world;
  std::string who;
  double in(int rank, int64_t i) const { return input_value(c.op, c.dtype, rank, world, i); }
  // Element i of a buffer of n values computed by value(i).
  Buffer make(int64_t n, const std::function<double(int64_t)>& value) const {
    Buffer b = make_buffer(c.dtype, n);
    for (int64_t i = 0; i < n; ++i) write_value(c.dtype, b.data(), i, value(i));
    return b;
  }
  TensorView view(Buffer& b, int64_t n) const { return testing::view(b, c.dtype, n); }
};

void run_allreduce(const OpRun& x) {
  const int64_t n = x.c.count;
  Buffer b = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  AllreduceOptions o;
  o.reduce_op = x.c.op;
  x.g.allreduce(x.view(b, n), o);
  check(
      b, x.c, n, [&](int64_t i) { return expected_reduction(x.c.op, x.c.dtype, x.world, i); },
      "allreduce " + x.who);
}

void run_reduce(const OpRun& x) {
  const int64_t n = x.c.count;
  Buffer b = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  ReduceOptions o;
  o.reduce_op = x.c.op;
  o.root_rank = x.c.root;
  x.g.reduce(x.view(b, n), o);
  if (x.r == x.c.root) {
    check(
        b, x.c, n, [&](int64_t i) { return expected_reduction(x.c.op, x.c.dtype, x.world, i); },
        "reduce root " + x.who);
  } else {
    check(
        b, x.c, n, [&](int64_t i) { return x.in(x.r, i); },
        "reduce non-root (must be unchanged) " + x.who);
  }
}

void run_broadcast(const OpRun& x) {
  const int64_t n = x.c.count;
  Buffer b = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  BroadcastOptions o;
  o.root_rank = x.c.root;
  x.g.broadcast(x.view(b, n), o);
  check(
      b, x.c, n, [&](int64_t i) { return x.in(x.c.root, i); }, "broadcast " + x.who);
}

// Odd cases use the list form with separate buffers, even ones the single buffer.
void run_allgather(const OpRun& x) {
  const int64_t n = x.c.count;
  Buffer in = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  if (n % 2 == 1) {
    std::vector<Buffer> outs;
    std::vector<TensorView> views;
    for (int k = 0; k < x.world; ++k) outs.push_back(make_buffer(x.c.dtype, n));
    for (int k = 0; k < x.world; ++k) views.push_back(x.view(outs[k], n));
    x.g.allgather(views, x.view(in, n));
    for (int k = 0; k < x.world; ++k) {
      check(
          outs[k], x.c, n, [&](int64_t i) { return x.in(k, i); },
          "allgather list[" + std::to_string(k) + "] " + x.who);
    }
  } else {
    Buffer out = make_buffer(x.c.dtype, n * x.world);
    x.g.allgather(x.view(out, n * x.world), x.view(in, n));
    check(
        out, x.c, n * x.world,
        [&](int64_t i) {
          return x.in(static_cast<int>(i / std::max<int64_t>(n, 1)), i % std::max<int64_t>(n, 1));
        },
        "allgather single buffer " + x.who);
  }
}

// Rank r's block k holds elements [k*n, (k+1)*n) of its logical input.
void run_reduce_scatter(const OpRun& x) {
  const int64_t n = x.c.count;
  Buffer out = make_buffer(x.c.dtype, n);
  auto want = [&](int64_t i) {
    return expected_reduction(x.c.op, x.c.dtype, x.world, static_cast<int64_t>(x.r) * n + i);
  };
  ReduceScatterOptions o;
  o.reduce_op = x.c.op;
  if (n % 2 == 1) {
    std::vector<Buffer> ins;
    std::vector<TensorView> views;
    for (int k = 0; k < x.world; ++k)
      ins.push_back(x.make(n, [&](int64_t i) { return x.in(x.r, k * n + i); }));
    for (int k = 0; k < x.world; ++k) views.push_back(x.view(ins[k], n));
    x.g.reduce_scatter(x.view(out, n), views, o);
    check(out, x.c, n, want, "reduce_scatter list " + x.who);
    for (int k = 0; k < x.world; ++k) {
      check(
          ins[k], x.c, n, [&](int64_t i) { return x.in(x.r, k * n + i); },
          "reduce_scatter input (must be unchanged) " + x.who);
    }
  } else {
    Buffer in = x.make(n * x.world, [&](int64_t i) { return x.in(x.r, i); });
    x.g.reduce_scatter(x.view(out, n), x.view(in, n * x.world), o);
    check(out, x.c, n, want, "reduce_scatter single buffer " + x.who);
  }
}

// Every rank sends its input to the next and receives from the previous; even ranks send first
// and odd ranks receive first, so blocking sends cannot deadlock.
void run_send_recv(const OpRun& x) {
  if (x.world == 1) return;
  const int64_t n = x.c.count;
  Buffer mine = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  Buffer got = make_buffer(x.c.dtype, n);
  const int next = (x.r + 1) % x.world, prev = (x.r - 1 + x.world) % x.world;
  if (x.r % 2 == 0) {
    x.g.send(x.view(mine, n), next);
    x.g.recv(x.view(got, n), prev);
  } else {
    x.g.recv(x.view(got, n), prev);
    x.g.send(x.view(mine, n), next);
  }
  check(
      got, x.c, n, [&](int64_t i) { return x.in(prev, i); },
      "recv from rank " + std::to_string(prev) + " at " + x.who);
}

// Rank r's block k (sent to rank k) holds elements [k*n, (k+1)*n) of its logical input, so rank
// r's output block k is rank k's elements [r*n, (r+1)*n).
void run_alltoall(const OpRun& x) {
  const int64_t n = x.c.count;
  const int w = x.world;
  auto want = [&](int64_t j) {  // element j of the whole output
    const int k = static_cast<int>(j / std::max<int64_t>(n, 1));
    return x.in(k, x.r * n + j % std::max<int64_t>(n, 1));
  };
  if (n % 2 == 1) {
    std::vector<Buffer> ins, outs;
    std::vector<TensorView> in_views, out_views;
    for (int k = 0; k < w; ++k) {
      ins.push_back(x.make(n, [&](int64_t i) { return x.in(x.r, k * n + i); }));
      outs.push_back(make_buffer(x.c.dtype, n));
    }
    for (int k = 0; k < w; ++k) {
      in_views.push_back(x.view(ins[k], n));
      out_views.push_back(x.view(outs[k], n));
    }
    x.g.alltoall(out_views, in_views);
    for (int k = 0; k < w; ++k) {
      check(
          outs[k], x.c, n, [&](int64_t i) { return want(k * n + i); },
          "alltoall list[" + std::to_string(k) + "] " + x.who);
    }
  } else {
    Buffer in = x.make(n * w, [&](int64_t i) { return x.in(x.r, i); });
    Buffer out = make_buffer(x.c.dtype, n * w);
    x.g.alltoall(x.view(out, n * w), x.view(in, n * w));
    check(out, x.c, n * w, want, "alltoall single buffer " + x.who);
  }
}

// Rank a sends rank b cnt(a, b) elements: sizes differ per pair (some are empty). Rank a's block
// for b holds its elements from b * stride on.
void run_alltoallv(const OpRun& x) {
  const int64_t n = x.c.count;
  const int w = x.world;
  auto cnt = [&](int a, int b) -> int64_t { return n == 0 ? 0 : (n + a + 2 * b) % (n + 1); };
  const int64_t stride = n + 3 * w;
  std::vector<int64_t> in_counts, out_counts;
  for (int k = 0; k < w; ++k) {
    in_counts.push_back(cnt(x.r, k));
    out_counts.push_back(cnt(k, x.r));
  }
  int64_t in_total = 0, out_total = 0;
  for (int k = 0; k < w; ++k) in_total += in_counts[k], out_total += out_counts[k];
  Buffer in = make_buffer(x.c.dtype, in_total);
  int64_t at = 0;
  for (int k = 0; k < w; ++k) {
    for (int64_t i = 0; i < in_counts[k]; ++i)
      write_value(x.c.dtype, in.data(), at++, x.in(x.r, k * stride + i));
  }
  Buffer out = make_buffer(x.c.dtype, out_total);
  x.g.alltoallv(x.view(out, out_total), x.view(in, in_total), out_counts, in_counts);
  std::vector<double> want;
  for (int k = 0; k < w; ++k) {
    for (int64_t i = 0; i < out_counts[k]; ++i) want.push_back(x.in(k, x.r * stride + i));
  }
  check(
      out, x.c, out_total, [&](int64_t j) { return want[j]; }, "alltoallv " + x.who);
}

// Rank k contributes cnt(k) elements (some none).
void run_allgatherv(const OpRun& x) {
  const int64_t n = x.c.count;
  const int w = x.world;
  std::vector<int64_t> counts;
  for (int k = 0; k < w; ++k) counts.push_back(n == 0 ? 0 : (n + 3 * k) % (n + 1));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Buffer in = x.make(counts[x.r], [&](int64_t i) { return x.in(x.r, i); });
  Buffer out = make_buffer(x.c.dtype, total);
  x.g.allgatherv(x.view(out, total), x.view(in, counts[x.r]), counts);
  std::vector<double> want;
  for (int k = 0; k < w; ++k) {
    for (int64_t i = 0; i < counts[k]; ++i) want.push_back(x.in(k, i));
  }
  check(
      out, x.c, total, [&](int64_t j) { return want[j]; }, "allgatherv " + x.who);
}

void run_gather(const OpRun& x) {
  const int64_t n = x.c.count;
  const int w = x.world;
  const bool root = x.r == x.c.root;
  Buffer in = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  GatherOptions o;
  o.root_rank = x.c.root;
  if (n % 2 == 1) {
    std::vector<Buffer> outs;
    std::vector<TensorView> views;
    if (root) {
      for (int k = 0; k < w; ++k) outs.push_back(make_buffer(x.c.dtype, n));
      for (int k = 0; k < w; ++k) views.push_back(x.view(outs[k], n));
    }
    x.g.gather(views, x.view(in, n), o);
    for (size_t k = 0; k < outs.size(); ++k) {
      check(
          outs[k], x.c, n, [&](int64_t i) { return x.in(static_cast<int>(k), i); },
          "gather list[" + std::to_string(k) + "] " + x.who);
    }
  } else {
    Buffer out = make_buffer(x.c.dtype, root ? n * w : 0);
    x.g.gather(x.view(out, root ? n * w : 0), x.view(in, n), o);
    if (root) {
      check(
          out, x.c, n * w,
          [&](int64_t j) {
            return x.in(static_cast<int>(j / std::max<int64_t>(n, 1)), j % std::max<int64_t>(n, 1));
          },
          "gather single buffer " + x.who);
    }
  }
}

// The root's block k holds its elements [k*n, (k+1)*n).
void run_scatter(const OpRun& x) {
  const int64_t n = x.c.count;
  const int w = x.world;
  const bool root = x.r == x.c.root;
  Buffer out = make_buffer(x.c.dtype, n);
  ScatterOptions o;
  o.root_rank = x.c.root;
  if (n % 2 == 1) {
    std::vector<Buffer> ins;
    std::vector<TensorView> views;
    if (root) {
      for (int k = 0; k < w; ++k)
        ins.push_back(x.make(n, [&](int64_t i) { return x.in(x.r, k * n + i); }));
      for (int k = 0; k < w; ++k) views.push_back(x.view(ins[k], n));
    }
    x.g.scatter(x.view(out, n), views, o);
  } else {
    Buffer in =
        root ? x.make(n * w, [&](int64_t i) { return x.in(x.r, i); }) : make_buffer(x.c.dtype, 0);
    x.g.scatter(x.view(out, n), x.view(in, root ? n * w : 0), o);
  }
  check(
      out, x.c, n, [&](int64_t i) { return x.in(x.c.root, x.r * n + i); }, "scatter " + x.who);
}

// One batch both ways round the ring: to the next rank and the previous, from both. At world
// size 2 both neighbours are one rank, and the two messages each way meet in posting order.
void run_batch(const OpRun& x) {
  if (x.world == 1) return;
  const int64_t n = x.c.count;
  const int next = (x.r + 1) % x.world, prev = (x.r - 1 + x.world) % x.world;
  Buffer to_next = x.make(n, [&](int64_t i) { return x.in(x.r, i); });
  Buffer to_prev = x.make(n, [&](int64_t i) { return x.in(x.r, i + 7); });
  Buffer from_prev = make_buffer(x.c.dtype, n), from_next = make_buffer(x.c.dtype, n);
  x.g.batch_isend_irecv(
      {P2POp::send(x.view(to_next, n), next), P2POp::send(x.view(to_prev, n), prev),
       P2POp::recv(x.view(from_prev, n), prev), P2POp::recv(x.view(from_next, n), next)});
  check(
      from_prev, x.c, n, [&](int64_t i) { return x.in(prev, i); }, "batch from prev at " + x.who);
  check(
      from_next, x.c, n, [&](int64_t i) { return x.in(next, i + 7); },
      "batch from next at " + x.who);
}

struct OpCase {
  void (*run)(const OpRun&);
  bool reducing;
  int64_t large;
};

const std::map<OpType, OpCase>& op_cases() {
  static const std::map<OpType, OpCase> table = {
      {OpType::kAllreduce, {run_allreduce, true, kLargeSize}},
      {OpType::kReduce, {run_reduce, true, kLargeSize}},
      {OpType::kBroadcast, {run_broadcast, false, kLargeSize}},
      {OpType::kAllgather, {run_allgather, false, kLargeGathered}},
      {OpType::kReduceScatter, {run_reduce_scatter, true, kLargeGathered}},
      {OpType::kSend, {run_send_recv, false, kLargeSize}},
      {OpType::kAlltoall, {run_alltoall, false, kLargeBlock}},
      {OpType::kAlltoallv, {run_alltoallv, false, kLargeBlock}},
      {OpType::kAllgatherv, {run_allgatherv, false, kLargeBlock}},
      {OpType::kGather, {run_gather, false, kLargeBlock}},
      {OpType::kScatter, {run_scatter, false, kLargeBlock}},
      {OpType::kBatchP2P, {run_batch, false, kLargeSize}},
  };
  return table;
}

class CollectiveMatrix : public ::testing::TestWithParam<std::tuple<std::string, int, OpType>> {};

TEST_P(CollectiveMatrix, MatchesReference) {
  const std::string backend = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  const OpCase& op = op_cases().at(std::get<2>(GetParam()));
  auto groups = create_groups(world, backend, unique_name("matrix"));
  ASSERT_EQ(groups[0]->backend_name(), backend);
  const auto all = cases(world, op.reducing, op.large);
  run_ranks(world, [&](int r) {
    for (const Case& c : all) {
      op.run(OpRun{*groups[r], c, r, world,
                   "rank " + std::to_string(r) + "/" + std::to_string(world)});
    }
  });
}

std::string name_of(const ::testing::TestParamInfo<CollectiveMatrix::ParamType>& info) {
  return std::get<0>(info.param) + "_" + to_string(std::get<2>(info.param)) + "_world" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Backends, CollectiveMatrix,
    ::testing::Combine(::testing::Values("gloo", "shm"), ::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values(OpType::kAllreduce, OpType::kReduce, OpType::kBroadcast,
                                         OpType::kAllgather, OpType::kReduceScatter, OpType::kSend,
                                         OpType::kAlltoall, OpType::kAlltoallv, OpType::kAllgatherv,
                                         OpType::kGather, OpType::kScatter, OpType::kBatchP2P)),
    name_of);

}  // namespace
}  // namespace tutti::testing
