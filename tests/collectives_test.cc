// Every op x dtype x reduce op x size, at world sizes 1, 2, 3, 4 and 8, ranks as threads.
// Groups are created once per (world size, op) and reused across all cases of that test.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "reference.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

const DType kAllDTypes[] = {DType::kBool,    DType::kInt8,     DType::kUInt8,   DType::kInt32,
                            DType::kUInt32,  DType::kInt64,    DType::kUInt64,  DType::kFloat16,
                            DType::kBFloat16, DType::kFloat32, DType::kFloat64};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg};
// Small sizes run for every dtype and reduce op; the large odd size runs once per dtype.
const int64_t kSmallSizes[] = {0, 1, 7, 1000};
constexpr int64_t kLargeSize = (1 << 20) + 3;

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

std::vector<Case> cases(int world, bool reducing) {
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
    out.push_back({dtype, ops[static_cast<size_t>(n) % ops.size()], kLargeSize, n % world});
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

// Fills element [offset, offset + count) of buf with rank r's inputs, indices shifted by base.
void fill(Buffer& buf, const Case& c, int r, int world, int64_t count, int64_t base = 0) {
  for (int64_t i = 0; i < count; ++i) {
    write_value(c.dtype, buf.data(), i, input_value(c.op, c.dtype, r, world, base + i));
  }
}

// Reports the first mismatching element, if any.
void check(const Buffer& buf, const Case& c, int64_t count, const std::function<double(int64_t)>& want,
           const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    const double got = read_value(c.dtype, buf.data(), i);
    const double expected = as_dtype(c.dtype, want(i));
    if (got != expected) {
      ADD_FAILURE() << what << " " << c.str() << ": element " << i << " is " << got
                    << ", expected " << expected;
      return;
    }
  }
}

class CollectiveMatrix
    : public ::testing::TestWithParam<std::tuple<std::string, int, OpType>> {};

TEST_P(CollectiveMatrix, MatchesReference) {
  const std::string backend = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  const OpType op = std::get<2>(GetParam());
  auto groups = create_groups(world, backend, unique_name("matrix"));
  ASSERT_EQ(groups[0]->backend_name(), backend);
  const bool reducing =
      op == OpType::kAllreduce || op == OpType::kReduce || op == OpType::kReduceScatter;
  const auto all = cases(world, reducing);
  run_ranks(world, [&](int r) {
    CollectiveGroup& g = *groups[r];
    for (const Case& c : all) {
      const std::string who = "rank " + std::to_string(r) + "/" + std::to_string(world);
      const int64_t n = c.count;
      switch (op) {
        case OpType::kAllreduce: {
          Buffer b = make_buffer(c.dtype, n);
          fill(b, c, r, world, n);
          AllreduceOptions o;
          o.reduce_op = c.op;
          g.allreduce(view(b, c.dtype, n), o);
          check(b, c, n, [&](int64_t i) { return expected_reduction(c.op, c.dtype, world, i); },
                "allreduce " + who);
          break;
        }
        case OpType::kReduce: {
          Buffer b = make_buffer(c.dtype, n);
          fill(b, c, r, world, n);
          ReduceOptions o;
          o.reduce_op = c.op;
          o.root_rank = c.root;
          g.reduce(view(b, c.dtype, n), o);
          if (r == c.root) {
            check(b, c, n, [&](int64_t i) { return expected_reduction(c.op, c.dtype, world, i); },
                  "reduce root " + who);
          } else {
            check(b, c, n, [&](int64_t i) { return input_value(c.op, c.dtype, r, world, i); },
                  "reduce non-root (must be unchanged) " + who);
          }
          break;
        }
        case OpType::kBroadcast: {
          Buffer b = make_buffer(c.dtype, n);
          fill(b, c, r, world, n);
          BroadcastOptions o;
          o.root_rank = c.root;
          g.broadcast(view(b, c.dtype, n), o);
          check(b, c, n, [&](int64_t i) { return input_value(c.op, c.dtype, c.root, world, i); },
                "broadcast " + who);
          break;
        }
        case OpType::kAllgather: {
          Buffer in = make_buffer(c.dtype, n);
          fill(in, c, r, world, n);
          // Odd cases use the list form with separate buffers, even ones the single buffer.
          if (n % 2 == 1) {
            std::vector<Buffer> outs;
            std::vector<TensorView> views;
            for (int k = 0; k < world; ++k) outs.push_back(make_buffer(c.dtype, n));
            for (int k = 0; k < world; ++k) views.push_back(view(outs[k], c.dtype, n));
            g.allgather(views, view(in, c.dtype, n));
            for (int k = 0; k < world; ++k) {
              check(outs[k], c, n,
                    [&](int64_t i) { return input_value(c.op, c.dtype, k, world, i); },
                    "allgather list[" + std::to_string(k) + "] " + who);
            }
          } else {
            Buffer out = make_buffer(c.dtype, n * world);
            g.allgather(view(out, c.dtype, n * world), view(in, c.dtype, n));
            check(out, c, n * world,
                  [&](int64_t i) { return input_value(c.op, c.dtype, int(i / std::max<int64_t>(n, 1)), world, i % std::max<int64_t>(n, 1)); },
                  "allgather single buffer " + who);
          }
          break;
        }
        case OpType::kReduceScatter: {
          // Rank r's block k holds elements [k*n, (k+1)*n) of its logical input.
          Buffer out = make_buffer(c.dtype, n);
          auto want = [&](int64_t i) {
            return expected_reduction(c.op, c.dtype, world, static_cast<int64_t>(r) * n + i);
          };
          ReduceScatterOptions o;
          o.reduce_op = c.op;
          if (n % 2 == 1) {
            std::vector<Buffer> ins;
            std::vector<TensorView> views;
            for (int k = 0; k < world; ++k) {
              ins.push_back(make_buffer(c.dtype, n));
              fill(ins.back(), c, r, world, n, static_cast<int64_t>(k) * n);
            }
            for (int k = 0; k < world; ++k) views.push_back(view(ins[k], c.dtype, n));
            g.reduce_scatter(view(out, c.dtype, n), views, o);
            check(out, c, n, want, "reduce_scatter list " + who);
            for (int k = 0; k < world; ++k) {
              check(ins[k], c, n,
                    [&](int64_t i) { return input_value(c.op, c.dtype, r, world, k * n + i); },
                    "reduce_scatter input (must be unchanged) " + who);
            }
          } else {
            Buffer in = make_buffer(c.dtype, n * world);
            fill(in, c, r, world, n * world);
            g.reduce_scatter(view(out, c.dtype, n), view(in, c.dtype, n * world), o);
            check(out, c, n, want, "reduce_scatter single buffer " + who);
          }
          break;
        }
        case OpType::kSend:
        case OpType::kRecv: {
          if (world == 1) break;
          // Every rank sends its input to the next and receives from the previous; even ranks
          // send first and odd ranks receive first, so blocking sends cannot deadlock.
          Buffer mine = make_buffer(c.dtype, n);
          Buffer got = make_buffer(c.dtype, n);
          fill(mine, c, r, world, n);
          const int next = (r + 1) % world, prev = (r - 1 + world) % world;
          if (r % 2 == 0) {
            g.send(view(mine, c.dtype, n), next);
            g.recv(view(got, c.dtype, n), prev);
          } else {
            g.recv(view(got, c.dtype, n), prev);
            g.send(view(mine, c.dtype, n), next);
          }
          check(got, c, n, [&](int64_t i) { return input_value(c.op, c.dtype, prev, world, i); },
                "recv from rank " + std::to_string(prev) + " at " + who);
          break;
        }
        default:
          FAIL() << "no matrix case for " << to_string(op);
      }
    }
  });
}

std::string name_of(const ::testing::TestParamInfo<CollectiveMatrix::ParamType>& info) {
  return std::get<0>(info.param) + "_" + to_string(std::get<2>(info.param)) + "_world" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveMatrix,
                         ::testing::Combine(::testing::Values("gloo", "shm"),
                                            ::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(OpType::kAllreduce, OpType::kReduce,
                                                              OpType::kBroadcast,
                                                              OpType::kAllgather,
                                                              OpType::kReduceScatter,
                                                              OpType::kSend)),
                         name_of);

}  // namespace
}  // namespace tutti::testing
