// Subgroups: split and new_group, ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <numeric>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

class Split : public ::testing::TestWithParam<std::string> {};

// 8 ranks split into evens and odds; both subgroups run every op at once, each rank checking
// values only its own subgroup can produce.
TEST_P(Split, EvensAndOddsRunEveryOpAtOnce) {
  const int world = 8;
  auto parents = create_groups(world, GetParam(), unique_name("parent"));
  std::vector<std::shared_ptr<CollectiveGroup>> subs(world);
  run_ranks(world, [&](int r) {
    auto evens = parents[r]->split({0, 2, 4, 6});
    auto odds = parents[r]->split({1, 3, 5, 7});
    EXPECT_EQ(evens == nullptr, r % 2 == 1);
    EXPECT_EQ(odds == nullptr, r % 2 == 0);
    subs[r] = r % 2 == 0 ? evens : odds;
  });
  run_ranks(world, [&](int r) {
    CollectiveGroup& g = *subs[r];
    const int w = 4, me = r / 2, parity = r % 2;
    // The global ranks of a subgroup are the parent's.
    ASSERT_EQ(g.world_size(), w);
    ASSERT_EQ(g.rank(), me);
    EXPECT_EQ(g.global_rank(), r);
    EXPECT_EQ(g.global_ranks(), (std::vector<int>{parity, parity + 2, parity + 4, parity + 6}));
    auto global = [&](int sub_rank) { return sub_rank * 2 + parity; };
    const int64_t sum = global(0) + global(1) + global(2) + global(3);

    std::vector<int64_t> v(1000, r);
    g.allreduce(v);
    EXPECT_EQ(v[999], sum);

    std::vector<int64_t> b(5000, r);
    BroadcastOptions bo;
    bo.root_rank = 2;
    g.broadcast(b, bo);
    EXPECT_EQ(b[4999], global(2));

    std::vector<int64_t> red(300, r);
    ReduceOptions ro;
    ro.root_rank = 1;
    ro.reduce_op = ReduceOp::kMax;
    g.reduce(red, ro);
    EXPECT_EQ(red[0], me == 1 ? global(3) : r);

    std::vector<int64_t> in(7, r), gathered(7 * w);
    g.allgather(TensorView(gathered), TensorView(in));
    for (int k = 0; k < w; ++k) EXPECT_EQ(gathered[7 * k], global(k));

    std::vector<int64_t> rs_in(3 * w), rs_out(3);
    for (int k = 0; k < w; ++k)
      std::fill(rs_in.begin() + 3 * k, rs_in.begin() + 3 * k + 3, r * 10 + k);
    g.reduce_scatter(TensorView(rs_out), TensorView(rs_in));
    EXPECT_EQ(rs_out[2], sum * 10 + me * w);

    std::vector<int64_t> a_in(2 * w), a_out(2 * w);
    for (int k = 0; k < w; ++k) a_in[2 * k] = a_in[2 * k + 1] = r * 100 + k;
    g.alltoall(TensorView(a_out), TensorView(a_in));
    for (int k = 0; k < w; ++k) EXPECT_EQ(a_out[2 * k], global(k) * 100 + me);

    std::vector<int64_t> counts = {1, 2, 3, 4};
    std::vector<int64_t> mine(counts[me], r), all(10);
    g.allgatherv(TensorView(all), TensorView(mine), counts);
    EXPECT_EQ(all[0], global(0));
    EXPECT_EQ(all[9], global(3));

    std::vector<int64_t> g_in(4, r), g_out(me == 0 ? 4 * w : 0);
    g.gather(TensorView(g_out), TensorView(g_in));
    if (me == 0) EXPECT_EQ(g_out[4 * 3], global(3));

    std::vector<int64_t> s_in(me == 3 ? 2 * w : 0), s_out(2, -1);
    for (size_t k = 0; k < s_in.size(); ++k) s_in[k] = static_cast<int64_t>(1000 + k);
    ScatterOptions so;
    so.root_rank = 3;
    g.scatter(TensorView(s_out), TensorView(s_in), so);
    EXPECT_EQ(s_out[1], 1000 + 2 * me + 1);

    const int right = (me + 1) % w, left = (me + w - 1) % w;
    std::vector<int64_t> out(9, r), got(9);
    g.batch_isend_irecv({P2POp::send(out, right), P2POp::recv(got, left)});
    EXPECT_EQ(got[8], global(left));

    if (me % 2 == 0) {
      g.send(out, me + 1);
    } else {
      g.recv(got, me - 1);
      EXPECT_EQ(got[0], global(me - 1));
    }
    g.barrier();
  });
  // The parent still works, and outlives nothing: destroying it leaves the subgroups working.
  run_ranks(world, [&](int r) {
    std::vector<int32_t> v(4, 1);
    parents[r]->allreduce(v);
    EXPECT_EQ(v[0], world);
    parents[r]->destroy();
    std::vector<int32_t> s(4, 1);
    subs[r]->allreduce(s);
    EXPECT_EQ(s[0], 4);
  });
}

TEST_P(Split, NamesDefaultsAndSplitsOfSplits) {
  auto parents = create_groups(4, GetParam(), unique_name("names"));
  run_ranks(4, [&](int r) {
    auto all = parents[r]->split({3, 2, 1, 0});  // reversed: the list's order gives the ranks
    ASSERT_NE(all, nullptr);
    EXPECT_EQ(all->rank(), 3 - r);
    EXPECT_EQ(all->name(), parents[r]->name() + ".split0");
    EXPECT_EQ(all->backend_name(), GetParam());
    SplitOptions o;
    o.name = "pair";
    auto pair = all->split({0, 1}, o);  // the subgroup's ranks 0 and 1: global ranks 3 and 2
    EXPECT_EQ(pair != nullptr, r >= 2);
    if (pair) {
      EXPECT_EQ(pair->name(), "pair");
      EXPECT_EQ(pair->global_ranks(), (std::vector<int>{3, 2}));
      std::vector<int32_t> v(3, r);
      pair->allreduce(v);
      EXPECT_EQ(v[0], 5);
    }
  });
}

TEST_P(Split, RanksThatDisagreeFailNamingBothLists) {
  auto parents = create_groups(3, GetParam(), unique_name("disagree"), milliseconds(5000));
  run_ranks(3, [&](int r) {
    const std::vector<int> ranks = r == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
    try {
      parents[r]->split(ranks);
      ADD_FAILURE() << "rank " << r << ": a split with disagreeing lists succeeded";
    } catch (const Error& e) {
      const std::string what = e.what();
      // The ranks that see the other list fail fast naming both; the rest time out.
      EXPECT_TRUE(e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kTimeout)
          << what;
      EXPECT_NE(what.find("split of group"), std::string::npos) << what;
    }
  });
}

// A split waits for its members in the parent's store while it holds the parent: abort() and
// destroy() of the parent from another thread end that wait at once (kAborted), not at the
// split's timeout (30 s here). Rank 2 never splits.
TEST_P(Split, AbortAndDestroyOfTheParentEndAWaitingSplit) {
  for (const bool destroy : {false, true}) {
    auto parents = create_groups(3, GetParam(), unique_name("stopsplit"), milliseconds(30000));
    double ended_ms = 0;
    std::string what;
    ErrorCode code = ErrorCode::kInternal;
    std::atomic<bool> calling{false};  // the splitter is at its call (a thread may start late)
    std::thread splitter([&] {
      parents[0]->issue_from_this_thread();
      calling = true;
      const auto start = std::chrono::steady_clock::now();
      try {
        parents[0]->split({0, 1, 2});
      } catch (const Error& e) {
        code = e.code();
        what = e.what();
      }
      ended_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count();
    });
    while (!calling) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(300));
    const auto stop = std::chrono::steady_clock::now();
    if (destroy) {
      parents[0]->destroy();
    } else {
      parents[0]->abort("stop splitting");
    }
    const double stop_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stop).count();
    splitter.join();
    EXPECT_EQ(code, ErrorCode::kAborted) << what;
    EXPECT_NE(what.find(destroy ? "destroyed" : "stop splitting"), std::string::npos) << what;
    EXPECT_NE(what.find("split of group"), std::string::npos) << what;
    EXPECT_LT(ended_ms, 300 + 3000) << what;
    EXPECT_LT(stop_ms, 3000) << (destroy ? "destroy" : "abort") << " waited for the split";
  }
}

TEST_P(Split, BadListsFailBeforeAnyIO) {
  auto parents = create_groups(2, GetParam(), unique_name("badsplit"));
  EXPECT_TUTTI_ERROR(parents[0]->split({}), ErrorCode::kInvalidArgument, "empty");
  EXPECT_TUTTI_ERROR(parents[0]->split({0, 2}), ErrorCode::kInvalidArgument,
                     "rank 2 is outside [0, 2)");
  EXPECT_TUTTI_ERROR(parents[0]->split({1, 1}), ErrorCode::kInvalidArgument,
                     "rank 1 is listed twice");
  // Nothing was consumed: a good split still lines up on both ranks.
  run_ranks(2, [&](int r) {
    auto both = parents[r]->split({0, 1});
    std::vector<int32_t> v(2, 1);
    both->allreduce(v);
    EXPECT_EQ(v[1], 2);
  });
}

// Local splits (SplitOptions::local): only the members call them, from any thread, in any order
// and interleaved with the parent's ops. Ranks 0 and 2 make a pair while ranks 1 and 3 make
// another; rank 0 then pairs with rank 3 too, from a second thread, while the parent runs an
// allreduce on its own thread. No rank ever calls a split it is not a member of.
TEST_P(Split, LocalSplitsMeetOnlyTheirMembers) {
  const int world = 4;
  auto parents = create_groups(world, GetParam(), unique_name("localparent"));
  auto local = [](const std::string& name) {
    SplitOptions o;
    o.local = true;
    o.name = name;
    return o;
  };
  std::vector<std::shared_ptr<CollectiveGroup>> first(world), cross(world);
  run_ranks(world, [&](int r) {
    // Two different pairs meet under their own names, listed in different orders.
    first[r] = r % 2 == 0 ? parents[r]->split({2, 0}, local("evens"))
                          : parents[r]->split({1, 3}, local("odds"));
    ASSERT_NE(first[r], nullptr);
    EXPECT_EQ(first[r]->world_size(), 2);
    EXPECT_EQ(first[r]->rank(), r == 2 || r == 1 ? 0 : 1);
    EXPECT_EQ(first[r]->name(), r % 2 == 0 ? "evens" : "odds");
    std::vector<int64_t> v(100, r + 1);
    first[r]->allreduce(v);
    EXPECT_EQ(v[99], r % 2 == 0 ? 1 + 3 : 2 + 4);
    if (r == 0 || r == 3) {
      std::thread other([&] { cross[r] = parents[r]->split({0, 3}, local("zero-three")); });
      other.join();
    }
    // The parent is untouched by its local splits: a collective of all four still lines up.
    std::vector<int64_t> all(10, r);
    parents[r]->allreduce(all);
    EXPECT_EQ(all[9], 0 + 1 + 2 + 3);
  });
  // The cross pair was made on other threads: it is theirs until handed over.
  run_ranks(world, [&](int r) {
    if (r != 0 && r != 3) return;
    cross[r]->issue_from_this_thread();
    std::vector<int64_t> v(3, r * 10);
    cross[r]->allreduce(v);
    EXPECT_EQ(v[2], 30);
    EXPECT_EQ(cross[r]->global_ranks(), (std::vector<int>{0, 3}));
  });
}

TEST_P(Split, LocalSplitsNeedANewNameAndTheirOwnRank) {
  auto parents = create_groups(2, GetParam(), unique_name("localbad"));
  SplitOptions o;
  o.local = true;
  EXPECT_TUTTI_ERROR(parents[0]->split({0, 1}, o), ErrorCode::kInvalidArgument, "needs a name");
  o.name = "pair";
  EXPECT_TUTTI_ERROR(parents[0]->split({1}, o), ErrorCode::kInvalidArgument,
                     "rank 0 is not among ranks 1");
  run_ranks(2, [&](int r) { ASSERT_NE(parents[r]->split({0, 1}, o), nullptr); });
  EXPECT_TUTTI_ERROR(parents[1]->split({0, 1}, o), ErrorCode::kInvalidUsage,
                     "the local split 'pair' was made before");
}

INSTANTIATE_TEST_SUITE_P(Backends, Split, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

// new_group registers the subgroup under its name for the free functions (one process: the
// registry is per process; tests/process_test.cc runs it across processes).
TEST(NewGroup, RegistersTheSubgroupByName) {
  const std::string parent = unique_name("world");
  const std::string name = unique_name("sub");
  init_collective_group(1, 0, "shm", parent);
  auto sub = new_group({0}, "", name, parent);
  ASSERT_NE(sub, nullptr);
  EXPECT_TRUE(is_group_initialized(name));
  EXPECT_EQ(get_rank(name), 0);
  std::vector<int32_t> v(3, 5);
  allreduce(v, name);
  EXPECT_EQ(v[2], 5);
  EXPECT_TUTTI_ERROR(new_group({0}, "", name, parent), ErrorCode::kInvalidUsage,
                     "already initialized");
  EXPECT_TUTTI_ERROR(new_group({0}, "", "x", "no-such-parent"), ErrorCode::kInvalidUsage,
                     "no-such-parent", "not initialized");
  destroy_collective_group(parent);
  allreduce(v, name);  // the subgroup outlives its parent
  destroy_collective_group(name);
}

}  // namespace
}  // namespace tutti::testing
