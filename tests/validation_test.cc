// Bad input fails with a tutti::Error naming group, rank, op and value, before any I/O: after
// each refused call the group still works.
#include <gtest/gtest.h>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

TEST(Validation, GroupCreation) {
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(0, 0, "gloo", "g"), ErrorCode::kInvalidArgument,
                     "world size must be positive, got 0");
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(-3, 0, "gloo", "g"), ErrorCode::kInvalidArgument,
                     "-3");
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(2, 2, "gloo", "g"), ErrorCode::kInvalidArgument,
                     "rank 2 is outside [0, 2)", "group 'g'");
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(2, -1, "gloo", "g"), ErrorCode::kInvalidArgument,
                     "rank -1");
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(1, 0, "gloo", ""), ErrorCode::kInvalidArgument,
                     "group name must not be empty");
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(2, 0, "gloo", "nostore"), ErrorCode::kInvalidArgument,
                     "group 'nostore'", "needs a store", "store_url");
  GroupOptions zero;
  zero.timeout = milliseconds(0);
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(1, 0, "gloo", "g", zero), ErrorCode::kInvalidArgument,
                     "timeout must be positive");
}

TEST(Validation, FreeFunctionsOnUnknownOrDestroyedGroups) {
  std::vector<float> v(4, 1.0f);
  EXPECT_TUTTI_ERROR(allreduce(v, "never"), ErrorCode::kInvalidUsage, "allreduce on group 'never'",
                     "not initialized");
  EXPECT_TUTTI_ERROR(get_group("never"), ErrorCode::kInvalidUsage, "never");
  init_collective_group(1, 0, "gloo", "solo");
  EXPECT_TUTTI_ERROR(init_collective_group(1, 0, "gloo", "solo"), ErrorCode::kInvalidUsage,
                     "already initialized");
  auto handle = get_group("solo");
  allreduce(v, "solo");
  EXPECT_EQ(v[0], 1.0f);
  destroy_collective_group("solo");
  EXPECT_FALSE(is_group_initialized("solo"));
  EXPECT_TUTTI_ERROR(handle->allreduce(v), ErrorCode::kInvalidUsage,
                     "allreduce on group 'solo' (rank 0/1)", "destroyed");
  destroy_collective_group("solo");  // unknown now: a logged no-op, no throw
}

TEST(Validation, AnyNonEmptyNameIsValid) {
  for (const std::string name : {"123?34!", "a/b", "sp ace", "ünï", "..", "%41"}) {
    init_collective_group(1, 0, "gloo", name);
    std::vector<int32_t> v(2, 7);
    allreduce(v, name);
    EXPECT_EQ(v[1], 7);
    destroy_collective_group(name);
  }
}

class TwoRankValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    groups_ = create_groups(2, "gloo", unique_name("valid"), milliseconds(20000));
  }

  // After the refused calls on rank 0 only, both ranks still complete a real allreduce.
  void ExpectStillUsable() {
    run_ranks(2, [&](int r) {
      std::vector<int64_t> v(3, r + 1);
      groups_[r]->allreduce(v);
      EXPECT_EQ(v[2], 3);
    });
  }

  std::vector<std::shared_ptr<CollectiveGroup>> groups_;
};

TEST_F(TwoRankValidation, RanksAndRoots) {
  CollectiveGroup& g = *groups_[0];
  const std::string name = "group '" + g.name() + "' (rank 0/2)";
  std::vector<float> v(5);
  BroadcastOptions b;
  b.root_rank = 2;
  EXPECT_TUTTI_ERROR(g.broadcast(v, b), ErrorCode::kInvalidArgument, "broadcast on " + name,
                     "root rank 2 is outside [0, 2)");
  ReduceOptions r;
  r.root_rank = -1;
  EXPECT_TUTTI_ERROR(g.reduce(v, r), ErrorCode::kInvalidArgument, "reduce on " + name,
                     "root rank -1");
  EXPECT_TUTTI_ERROR(g.send(v, 0), ErrorCode::kInvalidArgument, "send on " + name,
                     "destination rank 0 is this rank itself");
  EXPECT_TUTTI_ERROR(g.recv(v, 0), ErrorCode::kInvalidArgument, "recv on " + name,
                     "source rank 0 is this rank itself");
  EXPECT_TUTTI_ERROR(g.send(v, 5), ErrorCode::kInvalidArgument, "destination rank 5");
  EXPECT_TUTTI_ERROR(g.recv(v, -2), ErrorCode::kInvalidArgument, "source rank -2");
  ExpectStillUsable();
}

TEST_F(TwoRankValidation, ListsShapesAndDtypes) {
  CollectiveGroup& g = *groups_[0];
  std::vector<float> in(4), a(4), b(4), c(4), wrong(5);
  std::vector<double> other(4);
  for (const auto& list :
       {std::vector<TensorView>{}, std::vector<TensorView>{a}, std::vector<TensorView>{a, b, c}}) {
    EXPECT_TUTTI_ERROR(g.allgather(list, in), ErrorCode::kInvalidArgument, "allgather on group",
                       "output list has " + std::to_string(list.size()) + " tensors",
                       "expected one per rank (2)");
    EXPECT_TUTTI_ERROR(g.reduce_scatter(in, list), ErrorCode::kInvalidArgument,
                       "reduce_scatter on group", "input list has " + std::to_string(list.size()));
  }
  EXPECT_TUTTI_ERROR(g.allgather({a, wrong}, in), ErrorCode::kInvalidArgument,
                     "output 1 is float32[5] on cpu, input is float32[4] on cpu");
  EXPECT_TUTTI_ERROR(g.allgather({other, a}, in), ErrorCode::kInvalidArgument,
                     "output 0 has dtype float64, input has float32");
  EXPECT_TUTTI_ERROR(g.reduce_scatter(in, {a, wrong}), ErrorCode::kInvalidArgument,
                     "input 1 is float32[5]");
  std::vector<float> big(9);
  EXPECT_TUTTI_ERROR(g.allgather(TensorView(big), TensorView(in)), ErrorCode::kInvalidArgument,
                     "output has 9 elements, expected world size 2 x input's 4");
  EXPECT_TUTTI_ERROR(g.reduce_scatter(TensorView(in), TensorView(big)), ErrorCode::kInvalidArgument,
                     "input has 9 elements");
  float shaped[4];
  TensorView matrix(shaped, DType::kFloat32, {2, 2});
  EXPECT_TUTTI_ERROR(g.allgather({a, b}, matrix), ErrorCode::kInvalidArgument,
                     "output 0 is float32[4] on cpu, input is float32[2, 2] on cpu");
  ExpectStillUsable();
}

TEST_F(TwoRankValidation, DevicesAndReduceOps) {
  CollectiveGroup& g = *groups_[0];
  float x[4];
  TensorView gpu(x, DType::kFloat32, {4}, Device::cuda(0));
  EXPECT_TUTTI_ERROR(g.allreduce(gpu), ErrorCode::kInvalidArgument, "allreduce on group",
                     "tensor is on cuda:0", "backend 'gloo'");
  std::vector<int32_t> ints(4);
  AllreduceOptions avg;
  avg.reduce_op = ReduceOp::kAvg;
  EXPECT_TUTTI_ERROR(g.allreduce(ints, avg), ErrorCode::kInvalidArgument,
                     "avg is only defined for floating dtypes, got int32");
  ReduceScatterOptions rs_avg;
  rs_avg.reduce_op = ReduceOp::kAvg;
  std::vector<uint8_t> u(2), u0(2), u1(2);
  EXPECT_TUTTI_ERROR(g.reduce_scatter(u, {u0, u1}, rs_avg), ErrorCode::kInvalidArgument,
                     "reduce_scatter", "got uint8");
  AllreduceOptions negative;
  negative.timeout = milliseconds(-5);
  EXPECT_TUTTI_ERROR(g.allreduce(ints, negative), ErrorCode::kInvalidArgument,
                     "timeout must be positive, got -5 ms");
  ExpectStillUsable();
}

// The list forms: only this rank's entry may be the other tensor itself (in place); any other
// overlap is refused before any I/O, naming the entry (the staged copies and the single-copy
// reads of the others would otherwise read what this rank's outputs overwrote). The allowed
// in-place forms run at the end, on both ranks.
TEST_F(TwoRankValidation, ListFormsRefuseEntriesOverlappingTheirOtherTensor) {
  CollectiveGroup& g = *groups_[0];
  std::vector<float> buf(16);
  auto at = [&](int offset) { return TensorView(buf.data() + offset, 4); };
  EXPECT_TUTTI_ERROR(g.allgather({at(8), at(2)}, at(0)), ErrorCode::kInvalidArgument,
                     "allgather on group",
                     "output 1 and input overlap: only output 0 (this rank's) may be input "
                     "itself, in place");
  EXPECT_TUTTI_ERROR(g.allgather({at(8), at(0)}, at(0)), ErrorCode::kInvalidArgument,
                     "output 1 and input overlap");
  EXPECT_TUTTI_ERROR(g.allgather({at(3), at(8)}, at(0)), ErrorCode::kInvalidArgument,
                     "output 0 and input overlap");
  EXPECT_TUTTI_ERROR(g.reduce_scatter(at(6), {at(0), at(4)}), ErrorCode::kInvalidArgument,
                     "reduce_scatter on group",
                     "input 1 and output overlap: only input 0 (this rank's) may be output "
                     "itself, in place");
  EXPECT_TUTTI_ERROR(g.reduce_scatter(at(4), {at(0), at(4)}), ErrorCode::kInvalidArgument,
                     "input 1 and output overlap");
  // The multi-device forms, one device (CPU) here: each device's list by the same rule.
  EXPECT_TUTTI_ERROR(g.allgather_multigpu({{at(0), at(0)}}, {at(0)}), ErrorCode::kInvalidArgument,
                     "output list 0 entry 1 and input 0 overlap: only output list 0 entry 0 "
                     "(this rank's) may be input 0 itself, in place");
  EXPECT_TUTTI_ERROR(g.reduce_scatter_multigpu({at(2)}, {{at(0), at(8)}}),
                     ErrorCode::kInvalidArgument, "input list 0 entry 0 and output 0 overlap");
  // scatter's root copies its own block before it sends the others: an output over another
  // input overwrote that input first (helper-35; it went out as the root's block).
  EXPECT_TUTTI_ERROR(g.scatter(at(4), {at(0), at(4)}), ErrorCode::kInvalidArgument,
                     "scatter on group", "input 1 and output overlap");
  // alltoall's lists: only this rank's output may be its own input.
  EXPECT_TUTTI_ERROR(g.alltoall({at(0), at(4)}, {at(0), at(4)}), ErrorCode::kInvalidArgument,
                     "alltoall on group",
                     "output 1 and input 1 overlap: only output 0 (this rank's) may be input 0 "
                     "itself, in place");
  EXPECT_TUTTI_ERROR(g.alltoall({at(8), at(12)}, {at(0), at(10)}), ErrorCode::kInvalidArgument,
                     "output 0 and input 1 overlap");
  EXPECT_TUTTI_ERROR(g.alltoall({at(0), at(8)}, {at(0), at(2)}), ErrorCode::kInvalidArgument,
                     "output 0 and input 1 overlap");
  run_ranks(2, [&](int r) {
    std::vector<float> mine(8, 0.0f);
    std::fill(mine.begin() + 4 * r, mine.begin() + 4 * r + 4, static_cast<float>(r + 1));
    TensorView block0(mine.data(), 4), block1(mine.data() + 4, 4);
    const TensorView& own = r == 0 ? block0 : block1;
    groups_[r]->allgather({block0, block1}, own);  // in place: output r is the input
    EXPECT_EQ(mine, (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
    std::vector<float> parts(8, static_cast<float>(r + 1));
    TensorView part0(parts.data(), 4), part1(parts.data() + 4, 4);
    groups_[r]->reduce_scatter(r == 0 ? part0 : part1, {part0, part1});  // in place: input r
    EXPECT_EQ((r == 0 ? parts[0] : parts[4]), 3.0f);
    // alltoall with this rank's block in place, the other received elsewhere.
    std::vector<float> blocks(8, 0.0f), other(4, -1.0f);
    std::fill(blocks.begin(), blocks.begin() + 4, 10.0f * (r + 1));       // to rank 0
    std::fill(blocks.begin() + 4, blocks.end(), 10.0f * (r + 1) + 1.0f);  // to rank 1
    TensorView to0(blocks.data(), 4), to1(blocks.data() + 4, 4), elsewhere(other.data(), 4);
    std::vector<TensorView> outs =
        r == 0 ? std::vector<TensorView>{to0, elsewhere} : std::vector<TensorView>{elsewhere, to1};
    groups_[r]->alltoall(outs, {to0, to1});
    EXPECT_EQ(blocks[4 * r], 10.0f * (r + 1) + r) << "its own block, in place";
    EXPECT_EQ(other[0], r == 0 ? 20.0f : 11.0f) << "the other rank's block for this one";
  });
}

// Counts that wrap int64 to the right total (3 ranks: 2^63-1, 2^63-1 and 2 add up to 0 mod 2^64)
// are refused before any I/O, naming the entry.
TEST(Validation, CountsThatWrapAreRefused) {
  auto groups = create_groups(3, "gloo", unique_name("valid-wrap"), milliseconds(20000));
  std::vector<float> empty_out(0), empty_in(0);
  const int64_t max = INT64_MAX;
  EXPECT_TUTTI_ERROR(
      groups[0]->alltoallv(TensorView(empty_out), TensorView(empty_in), {0, 0, 0}, {max, max, 2}),
      ErrorCode::kInvalidArgument, "alltoallv on group", "input counts add up to more than 2^63");
}

TEST_F(TwoRankValidation, NewOpsCheckCountsListsAndOverlap) {
  CollectiveGroup& g = *groups_[0];
  std::vector<float> a(4), b(4), c(5), out(8), in(8), odd(7), odd_out(7);
  EXPECT_TUTTI_ERROR(g.alltoall(std::vector<TensorView>{a}, {a, b}), ErrorCode::kInvalidArgument,
                     "alltoall on group", "output list has 1 tensors");
  EXPECT_TUTTI_ERROR(g.alltoall({a, b}, {a, c}), ErrorCode::kInvalidArgument,
                     "input 1 is float32[5] on cpu, input 0 is float32[4] on cpu");
  EXPECT_TUTTI_ERROR(
      g.alltoall(TensorView(odd_out), TensorView(odd)), ErrorCode::kInvalidArgument,
      "input has 7 elements and output 7: both must hold world size (2) equal blocks");
  EXPECT_TUTTI_ERROR(g.alltoall(TensorView(in.data(), 8), TensorView(in.data() + 2, 4)),
                     ErrorCode::kInvalidArgument, "input has 4 elements and output 8");
  EXPECT_TUTTI_ERROR(g.alltoall(TensorView(in.data(), 4), TensorView(in.data() + 2, 4)),
                     ErrorCode::kInvalidArgument, "output and input overlap");
  EXPECT_TUTTI_ERROR(g.alltoallv(TensorView(out), TensorView(in), {4, 4}, {9, -1}),
                     ErrorCode::kInvalidArgument, "alltoallv on group",
                     "input counts[1] is negative: -1");
  EXPECT_TUTTI_ERROR(g.alltoallv(TensorView(out), TensorView(in), {4, 4}, {4, 3}),
                     ErrorCode::kInvalidArgument, "input counts add up to 7 elements, input has 8");
  EXPECT_TUTTI_ERROR(g.alltoallv(TensorView(out), TensorView(in), {8}, {4, 4}),
                     ErrorCode::kInvalidArgument,
                     "output counts has 1 entries, expected one per rank (2)");
  EXPECT_TUTTI_ERROR(g.allgatherv(TensorView(out), TensorView(a), {3, 5}),
                     ErrorCode::kInvalidArgument, "allgatherv on group",
                     "input has 4 elements, counts[0] says 3");
  EXPECT_TUTTI_ERROR(g.allgatherv(TensorView(out), TensorView(a), {4, 5}),
                     ErrorCode::kInvalidArgument, "counts add up to 9 elements, output has 8");
  GatherOptions go;
  go.root_rank = 3;
  EXPECT_TUTTI_ERROR(g.gather({a, b}, a, go), ErrorCode::kInvalidArgument, "gather on group",
                     "root rank 3 is outside [0, 2)");
  EXPECT_TUTTI_ERROR(g.gather(std::vector<TensorView>{a}, a), ErrorCode::kInvalidArgument,
                     "output list has 1 tensors");
  EXPECT_TUTTI_ERROR(g.gather(TensorView(c), TensorView(a)), ErrorCode::kInvalidArgument,
                     "output has 5 elements, expected world size 2 x input's 4");
  EXPECT_TUTTI_ERROR(g.scatter(a, {a, c}), ErrorCode::kInvalidArgument, "scatter on group",
                     "input 1 is float32[5] on cpu, output is float32[4] on cpu");
  std::vector<double> doubles(8);
  EXPECT_TUTTI_ERROR(g.scatter(TensorView(a), TensorView(doubles)), ErrorCode::kInvalidArgument,
                     "input has dtype float64, output has float32");
  ExpectStillUsable();
}

}  // namespace
}  // namespace tutti::testing
