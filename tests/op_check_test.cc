// What ranks that disagree learn (issue 10, C.15/C.16 and the opt-in op check): with
// GroupOptions::check_ops (or TUTTI_DEBUG=DETAIL) every rank fails the op with a diff naming
// the ranks and what each called, and the group stays usable; without it shm names both
// signatures; a zero-element op on one rank only fails there too; abort reasons do not repeat
// the group; init errors all say which init failed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <regex>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::vector<std::shared_ptr<CollectiveGroup>> checked_groups(int world, const std::string& backend,
                                                             milliseconds timeout,
                                                             bool check_ops = true) {
  auto store = std::make_shared<HashStore>(timeout);
  const std::string name = unique_name("checked");
  std::vector<std::shared_ptr<CollectiveGroup>> groups(world);
  run_ranks(world, [&](int rank) {
    GroupOptions o;
    o.store = store;
    o.timeout = timeout;
    o.check_ops = check_ops;
    groups[rank] = CollectiveGroup::create(world, rank, backend, name, o);
  });
  return groups;
}

// How many times `needle` occurs in `text`.
size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class OpCheck : public ::testing::TestWithParam<std::string> {};

// Rank 1 of 3 differs in count, dtype, op, root or reduce op: every rank fails at once with
// the same diff, and the group goes on to the next op.
TEST_P(OpCheck, EveryRankNamesTheRanksThatDisagreeAndWhatEachCalled) {
  auto groups = checked_groups(3, GetParam(), milliseconds(20000));
  struct Case {
    const char* what;
    std::function<void(CollectiveGroup&, bool odd)> call;
    const char* ours;
    const char* theirs;
  };
  const std::vector<Case> cases = {
      {"count",
       [](CollectiveGroup& g, bool odd) {
         std::vector<float> v(odd ? 5 : 4, 1.0f);
         g.allreduce(v);
       },
       "ranks 0, 2 called allreduce #0 float32[4] sum",
       "rank 1 called allreduce #0 float32[5] sum"},
      {"dtype",
       [](CollectiveGroup& g, bool odd) {
         if (odd) {
           std::vector<int32_t> v(4, 1);
           g.allreduce(v);
         } else {
           std::vector<float> v(4, 1.0f);
           g.allreduce(v);
         }
       },
       "ranks 0, 2 called allreduce #1 float32[4] sum", "rank 1 called allreduce #1 int32[4] sum"},
      {"op",
       [](CollectiveGroup& g, bool odd) {
         std::vector<float> v(4, 1.0f);
         if (odd) {
           g.broadcast(v);
         } else {
           g.allreduce(v);
         }
       },
       "ranks 0, 2 called allreduce #2 float32[4] sum",
       "rank 1 called broadcast #2 float32[4] root 0"},
      {"root",
       [](CollectiveGroup& g, bool odd) {
         std::vector<float> v(4, 1.0f);
         BroadcastOptions o;
         o.root_rank = odd ? 2 : 0;
         g.broadcast(v, o);
       },
       "ranks 0, 2 called broadcast #3 float32[4] root 0",
       "rank 1 called broadcast #3 float32[4] root 2"},
      {"reduce op",
       [](CollectiveGroup& g, bool odd) {
         std::vector<float> v(4, 1.0f);
         AllreduceOptions o;
         o.reduce_op = odd ? ReduceOp::kMax : ReduceOp::kSum;
         g.allreduce(v, o);
       },
       "ranks 0, 2 called allreduce #4 float32[4] sum",
       "rank 1 called allreduce #4 float32[4] max"},
      {"shape",
       [](CollectiveGroup& g, bool odd) {
         std::vector<float> v(6, 1.0f);
         g.allreduce(TensorView(v.data(), DType::kFloat32,
                                odd ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3}));
       },
       "ranks 0, 2 called allreduce #5 float32[2, 3] sum",
       "rank 1 called allreduce #5 float32[3, 2] sum"},
  };
  run_ranks(3, [&](int r) {
    for (const Case& c : cases) {
      const auto start = Clock::now();
      SCOPED_TRACE(c.what);
      EXPECT_TUTTI_ERROR(c.call(*groups[r], r == 1), ErrorCode::kInvalidUsage,
                         "the ranks called different ops", c.ours, c.theirs);
      EXPECT_LT(Clock::now() - start, milliseconds(5000)) << c.what << ": not at the timeout";
      EXPECT_FALSE(groups[r]->is_aborted()) << c.what;
    }
    // The group is in step and usable.
    std::vector<int32_t> v(100, r + 1);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[99], 6);
  });
}

// A skipped collective: rank 1 never calls the broadcast between two allreduces.
TEST_P(OpCheck, ASkippedCollectiveIsNamed) {
  auto groups = checked_groups(2, GetParam(), milliseconds(20000));
  run_ranks(2, [&](int r) {
    std::vector<float> v(8, 1.0f);
    if (r == 0) {
      EXPECT_TUTTI_ERROR(groups[0]->broadcast(v), ErrorCode::kInvalidUsage,
                         "rank 0 called broadcast #0 float32[8] root 0",
                         "rank 1 called allreduce #0 float32[8] sum");
    } else {
      EXPECT_TUTTI_ERROR(groups[1]->allreduce(v), ErrorCode::kInvalidUsage,
                         "rank 0 called broadcast #0");
    }
  });
}

TEST_P(OpCheck, TuttiDebugDetailTurnsItOn) {
  ::setenv("TUTTI_DEBUG", "detail", 1);
  auto groups = checked_groups(2, GetParam(), milliseconds(20000), /*check_ops=*/false);
  ::unsetenv("TUTTI_DEBUG");
  run_ranks(2, [&](int r) {
    std::vector<int64_t> v(r == 0 ? 3 : 4, 1);
    EXPECT_TUTTI_ERROR(groups[r]->allreduce(v), ErrorCode::kInvalidUsage,
                       "rank 0 called allreduce #0 int64[3] sum",
                       "rank 1 called allreduce #0 int64[4] sum");
  });
}

// Without the check, a rank alone in calling a collective with no elements fails too: it meets
// the others under the op's own tag instead of returning at once.
TEST_P(OpCheck, ZeroElementsOnOneRankOnlyFailsThere) {
  auto groups = checked_groups(2, GetParam(), milliseconds(1000), /*check_ops=*/false);
  run_ranks(2, [&](int r) {
    std::vector<float> v(r == 0 ? 0 : 4, 1.0f);
    const auto start = Clock::now();
    try {
      groups[r]->allreduce(v);
      ADD_FAILURE() << "rank " << r << ": allreduce returned OK while the other rank disagreed";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kRemoteError ||
                  e.code() == ErrorCode::kIoError)
          << e.what();
      if (GetParam() == "shm" && e.code() == ErrorCode::kRemoteError) {
        EXPECT_NE(std::string(e.what()).find("float32[0]"), std::string::npos) << e.what();
      }
    }
    EXPECT_LT(Clock::now() - start, milliseconds(1000 + 3000));
  });
}

// An op that timed out aborts the group; later messages, here and at the peers, name the group
// once and the failed op by number.
TEST_P(OpCheck, AbortReasonsDoNotRepeatTheGroup) {
  // Rank 1's allreduce ends with rank 0's abort on shm; on gloo, waiting on rank 2, at the
  // group's timeout (kept short: the messages are what is checked here).
  auto groups = checked_groups(3, GetParam(), milliseconds(5000), /*check_ops=*/false);
  std::string late, peer;
  run_ranks(3, [&](int r) {
    std::vector<float> v(16, 1.0f);
    if (r == 0) {
      AllreduceOptions o;
      o.timeout = milliseconds(300);
      EXPECT_TUTTI_ERROR(groups[0]->allreduce(v, o), ErrorCode::kTimeout, "allreduce #0");
      try {
        groups[0]->barrier();
      } catch (const Error& e) {
        late = e.what();
      }
    } else if (r == 1) {
      try {
        groups[1]->allreduce(v);  // rank 2 never joins; rank 0's abort ends it
      } catch (const Error& e) {
        peer = e.what();
      }
    }
  });
  EXPECT_NE(late.find("allreduce #0 failed: timed out"), std::string::npos) << late;
  EXPECT_EQ(count_of(late, "on group"), 1u) << late;
  EXPECT_EQ(count_of(peer, "on group"), 1u) << peer;
}

INSTANTIATE_TEST_SUITE_P(Backends, OpCheck, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

// C.15: every way an init can fail says which init it was.
TEST(InitErrors, AllCarryTheInitPrefix) {
  TempDir dir;
  std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"unknown backend", [] { CollectiveGroup::create(1, 0, "nope", "g"); }},
      {"bad store URL",
       [] {
         GroupOptions o;
         o.store_url = "bogus://x";
         CollectiveGroup::create(2, 1, "gloo", "g", o);
       }},
      {"unreachable store",
       [] {
         GroupOptions o;
         o.store_url = "tcp://127.0.0.1:" + std::to_string(free_port());
         o.timeout = milliseconds(300);
         CollectiveGroup::create(2, 1, "gloo", "g", o);
       }},
      {"missing rank",
       [&] {
         GroupOptions o;
         o.store_url = "file://" + dir.path() + "/store";
         o.timeout = milliseconds(300);
         CollectiveGroup::create(2, 0, "gloo", "g", o);
       }},
      {"unusable file store",
       [] {
         GroupOptions o;
         o.store_url = "file:///proc/no/such/dir/store";
         o.timeout = milliseconds(300);
         CollectiveGroup::create(2, 0, "shm", "g", o);
       }},
  };
  for (auto& [what, fn] : cases) {
    try {
      fn();
      ADD_FAILURE() << what << ": init succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("init on group 'g' (rank ", 0), 0u)
          << what << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace tutti::testing
