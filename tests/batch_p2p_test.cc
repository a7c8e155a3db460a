// batch_isend_irecv: exchanges that would deadlock as blocking calls, at world sizes 2..8, with
// messages larger than the shm mailbox (two 256 KiB slots per pair); batched sends meeting plain
// receives; mismatches refused.
#include <gtest/gtest.h>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kCount = (1 << 20) / 4 + 17;  // just over 1 MiB of int32

// Element i of what rank `from` sends rank `to`.
int32_t value(int from, int to, int64_t i) {
  return from * 1000003 + to * 1009 + static_cast<int32_t>(i % 997);
}

void expect_from(const std::vector<int32_t>& got, int from, int to) {
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    if (got[i] != value(from, to, i)) {
      ADD_FAILURE() << "rank " << to << " got element " << i << " = " << got[i] << " from rank "
                    << from << ", expected " << value(from, to, i);
      return;
    }
  }
}

std::vector<int32_t> message(int from, int to, int64_t n = kCount) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(from, to, i);
  return v;
}

class BatchP2P : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Everyone sends right and receives left, in one batch each: as blocking calls every rank would
// sit in its send.
TEST_P(BatchP2P, ARingCannotDeadlock) {
  const auto [backend, world] = GetParam();
  auto groups = create_groups(world, backend, unique_name("ring"), milliseconds(30000));
  run_ranks(world, [&, world = world](int r) {
    const int right = (r + 1) % world, left = (r - 1 + world) % world;
    auto out = message(r, right);
    std::vector<int32_t> in(kCount);
    groups[r]->batch_isend_irecv({P2POp::send(out, right), P2POp::recv(in, left)});
    expect_from(in, left, r);
  });
}

// Every rank sends to and receives from every other rank in one batch, sends first.
TEST_P(BatchP2P, AllPairsCannotDeadlock) {
  const auto [backend, world] = GetParam();
  auto groups = create_groups(world, backend, unique_name("pairs"), milliseconds(30000));
  run_ranks(world, [&, world = world](int r) {
    std::vector<std::vector<int32_t>> outs(world), ins(world);
    std::vector<P2POp> ops;
    for (int p = 0; p < world; ++p) {
      if (p == r) continue;
      outs[p] = message(r, p);
      ops.push_back(P2POp::send(outs[p], p));
    }
    for (int p = 0; p < world; ++p) {
      if (p == r) continue;
      ins[p].resize(kCount);
      ops.push_back(P2POp::recv(ins[p], p));
    }
    groups[r]->batch_isend_irecv(ops);
    for (int p = 0; p < world; ++p) {
      if (p != r) expect_from(ins[p], p, r);
    }
  });
}

std::string name_of(const ::testing::TestParamInfo<BatchP2P::ParamType>& info) {
  return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchP2P,
                         ::testing::Combine(::testing::Values("gloo", "shm"),
                                            ::testing::Values(2, 3, 4, 5, 6, 7, 8)),
                         name_of);

class BatchP2PRules : public ::testing::TestWithParam<std::string> {};

// Messages are numbered per peer and direction however they are posted: batched sends meet plain
// receives and the other way round, in order.
TEST_P(BatchP2PRules, BatchedAndPlainMessagesMeet) {
  auto groups = create_groups(2, GetParam(), unique_name("mixed"));
  run_ranks(2, [&](int r) {
    CollectiveGroup& g = *groups[r];
    if (r == 0) {
      auto a = message(0, 1, 100), b = message(0, 1, 300);
      g.batch_isend_irecv({P2POp::send(a, 1), P2POp::send(b, 1)});
      g.send(a, 1);
      std::vector<int32_t> back(50);
      g.recv(back, 1);
      expect_from(back, 1, 0);
    } else {
      std::vector<int32_t> a(100), b(300), c(100);
      g.recv(a, 0);
      g.batch_isend_irecv({P2POp::recv(b, 0), P2POp::recv(c, 0)});
      expect_from(a, 0, 1);
      expect_from(b, 0, 1);
      expect_from(c, 0, 1);
      auto back = message(1, 0, 50);
      g.batch_isend_irecv({P2POp::send(back, 0)});
    }
  });
}

// A send whose size differs from the receive never delivers into it.
TEST_P(BatchP2PRules, SizesThatDifferNeverMeet) {
  auto groups = create_groups(2, GetParam(), unique_name("sizes"), milliseconds(1000));
  run_ranks(2, [&](int r) {
    if (r == 0) {
      auto a = message(0, 1, 10);
      // Longer than the receive's 1 s: the receiver times out first (were the sender first, its
      // abort would reset the connection under the receive, which then fails with kIoError).
      BatchP2POptions longer;
      longer.timeout = milliseconds(3000);
      try {
        groups[0]->batch_isend_irecv({P2POp::send(a, 1)}, longer);
      } catch (const Error&) {
        // gloo: the send fails (the receiver's abort, or its own timeout); shm: the slot is free,
        // so the send completes.
      }
    } else {
      std::vector<int32_t> b(12, -1);
      try {
        groups[1]->batch_isend_irecv({P2POp::recv(b, 0)});
        ADD_FAILURE() << "a receive of 12 met a send of 10";
      } catch (const Error& e) {
        EXPECT_TRUE(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kRemoteError)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("batch_isend_irecv #0"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(b, std::vector<int32_t>(12, -1));
    }
  });
}

TEST_P(BatchP2PRules, BadRequestsFailBeforeAnyIO) {
  auto groups = create_groups(2, GetParam(), unique_name("badbatch"));
  std::vector<int32_t> v(4);
  EXPECT_TUTTI_ERROR(groups[0]->batch_isend_irecv({P2POp::send(v, 0)}), ErrorCode::kInvalidArgument,
                     "batch_isend_irecv on group",
                     "send 0's destination rank 0 is this rank itself");
  EXPECT_TUTTI_ERROR(groups[0]->batch_isend_irecv({P2POp::send(v, 1), P2POp::recv(v, 5)}),
                     ErrorCode::kInvalidArgument, "recv 1's source rank 5 is outside [0, 2)");
  // Nothing was posted: the group still works, and an empty batch is a no-op.
  groups[0]->batch_isend_irecv({});
  run_ranks(2, [&](int r) {
    std::vector<int32_t> x(3, r + 1);
    groups[r]->allreduce(x);
    EXPECT_EQ(x[0], 3);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchP2PRules, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
