// abort() and destroy() from another thread while an op runs: the op ends at once with kAborted,
// the peers learn of it, and the group can be created again. Bounds here are "long before the
// op's own timeout" (seconds against 20-30 s), never a speed target: benchmarks measure speed.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

class Abort : public ::testing::TestWithParam<std::string> {};

TEST_P(Abort, AbortFromAnotherThreadEndsARunningOp) {
  // Rank 1 never joins: rank 0's op would wait 30 s.
  auto groups = create_groups(2, GetParam(), unique_name("abort"), milliseconds(30000));
  std::vector<float> v(1 << 16, 1.0f);
  double ended_ms = 0;
  std::thread op([&] {
    const auto start = Clock::now();
    EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kAborted, "allreduce #0",
                       "the test says stop");
    ended_ms = ms_since(start);
  });
  std::this_thread::sleep_for(milliseconds(200));
  groups[0]->abort("the test says stop");
  op.join();
  EXPECT_LT(ended_ms, 200 + 2000);
  EXPECT_TRUE(groups[0]->is_aborted());
  EXPECT_TUTTI_ERROR(groups[0]->barrier(), ErrorCode::kAborted, "the test says stop");
}

TEST_P(Abort, QueuedOpsEndWithTheAbort) {
  auto groups = create_groups(2, GetParam(), unique_name("abort-q"), milliseconds(30000));
  std::vector<std::vector<int32_t>> bufs(4, std::vector<int32_t>(100, 1));
  AllreduceOptions o;
  o.async_op = true;
  std::vector<std::shared_ptr<Work>> works;
  for (auto& b : bufs) works.push_back(groups[0]->allreduce(b, o));
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = Clock::now();
  groups[0]->abort("stop them all");
  for (auto& w : works) {
    EXPECT_TUTTI_ERROR(w->wait(), ErrorCode::kAborted, "stop them all");
  }
  EXPECT_LT(ms_since(start), 2000);
}

// A peer waiting on the aborted rank ends too: shm through the abort word (naming the rank and
// the reason), gloo because the aborted rank resets its connections (naming the rank). Each rank
// waits in a receive from the other, so neither op could ever complete. (Not an allreduce
// against a receive: on gloo both travel the same connection, and the receive would fail at once
// on the allreduce's header.)
TEST_P(Abort, APeerWaitingOnTheAbortedRankLearnsOfIt) {
  auto groups = create_groups(2, GetParam(), unique_name("abort-peer"), milliseconds(30000));
  std::thread rank1([&] {
    std::vector<float> v(1 << 16, 1.0f);
    const auto start = Clock::now();
    try {
      groups[1]->recv(v, 0);
      ADD_FAILURE() << "rank 1's receive succeeded without a send";
    } catch (const Error& e) {
      const std::string what = e.what();
      if (GetParam() == "shm") {
        EXPECT_EQ(e.code(), ErrorCode::kRemoteError) << what;
        EXPECT_NE(what.find("rank 0 aborted the group: enough"), std::string::npos) << what;
      } else {
        EXPECT_EQ(e.code(), ErrorCode::kIoError) << what;
        EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
      }
    }
    EXPECT_LT(ms_since(start), 5000);
  });
  std::thread rank0([&] {
    std::vector<float> v(16);
    EXPECT_TUTTI_ERROR(groups[0]->recv(v, 1), ErrorCode::kAborted, "enough");
  });
  std::this_thread::sleep_for(milliseconds(300));
  groups[0]->abort("enough");
  rank0.join();
  rank1.join();
}

// Every peer learns of it, whichever side of each connection the aborted rank was (Gloo's
// pairs: the side with the greater address connects, the other accepts; the aborted rank must
// find both kinds of socket to reset them).
TEST_P(Abort, EveryPeerWaitingOnTheAbortedRankLearnsOfIt) {
  constexpr int kRanks = 4;
  auto groups = create_groups(kRanks, GetParam(), unique_name("abort-all"), milliseconds(30000));
  std::vector<std::thread> peers;
  for (int r = 1; r < kRanks; ++r) {
    peers.emplace_back([&, r] {
      std::vector<float> v(16);
      const auto start = Clock::now();
      try {
        groups[r]->recv(v, 0);
        ADD_FAILURE() << "rank " << r << " received from a rank that never sent";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_TRUE(e.code() == ErrorCode::kIoError || e.code() == ErrorCode::kRemoteError)
            << "rank " << r << ": " << what;
        EXPECT_NE(what.find("rank 0"), std::string::npos) << "rank " << r << ": " << what;
      }
      EXPECT_LT(ms_since(start), 5000) << "rank " << r;
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  groups[0]->abort("enough");
  for (auto& t : peers) t.join();
}

TEST_P(Abort, DestroyFromAnotherThreadReturnsPromptly) {
  auto groups = create_groups(2, GetParam(), unique_name("abort-destroy"), milliseconds(30000));
  std::vector<float> v(1 << 16, 1.0f);
  std::atomic<bool> calling{false};  // the op's thread is at its call (a thread may start late)
  std::thread op([&] {
    calling = true;
    EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kAborted, "destroyed");
  });
  while (!calling) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(200));
  const auto start = Clock::now();
  groups[0]->destroy();
  EXPECT_LT(ms_since(start), 2000);
  op.join();
  EXPECT_TUTTI_ERROR(groups[0]->barrier(), ErrorCode::kInvalidUsage, "destroyed");
}

// The named-group form, then the same name again.
TEST_P(Abort, ANamedGroupAbortsAndIsCreatedAgain) {
  const std::string name = unique_name("named-abort");
  EXPECT_FALSE(abort_collective_group(name, "nothing there"));
  init_collective_group(1, 0, GetParam(), name);
  EXPECT_TRUE(abort_collective_group(name, "by name"));
  std::vector<int32_t> v(3, 2);
  EXPECT_TUTTI_ERROR(allreduce(v, name), ErrorCode::kAborted, "by name");
  destroy_collective_group(name);
  init_collective_group(1, 0, GetParam(), name);
  allreduce(v, name);
  EXPECT_EQ(v[0], 2);
  destroy_collective_group(name);
}

INSTANTIATE_TEST_SUITE_P(Backends, Abort, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

// Real processes: destroy mid-op on rank 0, its peer fails naming it, then everyone re-creates
// the group under the same name (see scenario_abort_mid_op).
class AbortProcesses : public ::testing::TestWithParam<std::string> {};

TEST_P(AbortProcesses, DestroyMidOpThenCreateAgain) {
  TempDir dir;
  auto results = run_workers("abort_mid_op", 2, "file://" + dir.path() + "/store",
                             milliseconds(60000), {"20000", GetParam()});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AbortProcesses, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
