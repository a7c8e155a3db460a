// Ranks as real processes over a FileStore: launch, timeouts, crashes, exit.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string file_url(const TempDir& dir) {
  return "file://" + dir.path() + "/store";
}

void expect_all_ok(const std::vector<WorkerResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (signal " << results[r].signal << "):\n"
                                       << results[r].output;
  }
}

TEST(Processes, AllreduceThroughTheFreeFunctions) {
  for (int world : {1, 2, 4}) {
    TempDir dir;
    expect_all_ok(run_workers("allreduce", world, file_url(dir), milliseconds(60000)));
  }
}

TEST(Processes, RaySemantics) {
  TempDir dir;
  expect_all_ok(run_workers("ray", 2, file_url(dir), milliseconds(120000)));
}

TEST(Processes, RankThatNeverArrivesTimesOutNamingIt) {
  TempDir dir;
  const auto start = Clock::now();
  // World size 3; rank 2 is never started. Timeout 1500 ms.
  auto results =
      run_workers("never_arrive", 3, file_url(dir), milliseconds(30000), {"1500"}, {0, 1});
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  expect_all_ok(results);
  // Within the timeout plus a margin for process start-up on a loaded machine.
  EXPECT_LT(elapsed.count(), 1500 + 5000);
}

// The same through a tcp:// store rank 0 hosts: rank 1 fails within its timeout, naming the
// missing rank, not a store timeout or three later (it was 20 s for a 5 s timeout: each of its
// last store calls waited for the host rank 0 had taken away with its own failure).
TEST(Processes, RankThatNeverArrivesIsNamedOnEveryRankThroughATcpStore) {
  auto results = run_workers("never_arrive", 3, "tcp://127.0.0.1:" + std::to_string(free_port()),
                             milliseconds(30000), {"1500"}, {0, 1});
  expect_all_ok(results);
  for (const auto& r : results) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, std::regex("elapsed_ms=([0-9]+)"))) << r.output;
    EXPECT_LT(std::stoi(m[1]), 1500 + 1000) << r.output;
  }
}

// Rank 0 hosts the tcp:// store and never starts, or dies half a second into the rendezvous:
// the others say so, within their timeout and one store timeout (1.5 s each).
TEST(Processes, TheStoresHostMissingOrDeadIsNamed) {
  // Rank 2 never comes, so rank 0 dies while the rendezvous waits for it.
  for (const std::vector<int>& ranks : {std::vector<int>{1, 2}, std::vector<int>{0, 1}}) {
    auto results = run_workers("host_gone", 3, "tcp://127.0.0.1:" + std::to_string(free_port()),
                               milliseconds(30000), {"1500"}, ranks);
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == 0) {
        EXPECT_EQ(results[i].signal, SIGKILL) << results[i].output;
        continue;
      }
      EXPECT_EQ(results[i].exit_code, 0) << results[i].output;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(results[i].output, m, std::regex("elapsed_ms=([0-9]+)")))
          << results[i].output;
      EXPECT_LT(std::stoi(m[1]), 1500 + 1500 + 1000) << results[i].output;
    }
  }
}

// A caller's own TCP store outlives its host's destroy for the others (scenario_caller_store):
// the late rank's destroy takes well under its 5 s store timeout.
void expect_quick_destroys(const char* scenario, int world) {
  TempDir dir;
  auto results = run_workers(scenario, world, file_url(dir), milliseconds(30000), {"5000"});
  expect_all_ok(results);
  for (int i = 0; i < 2; ++i) {  // rank 2 (shrunk: the rank that left) destroys no shrunk group
    std::smatch m;
    ASSERT_TRUE(std::regex_search(results[i].output, m, std::regex("destroy_ms=([0-9]+)")))
        << results[i].output;
    EXPECT_LT(std::stoi(m[1]), 1000) << results[i].output;
  }
}

TEST(Processes, ACallersStoreOutlivesItsHostsDestroyForTheOthers) {
  expect_quick_destroys("caller_store", 2);
}

// As above, for the group the survivors shrink to (it takes the parent's leaving over).
TEST(Processes, ACallersStoreOutlivesItsHostsDestroyOfAShrunkGroup) {
  expect_quick_destroys("caller_store_shrunk", 3);
}

TEST(Processes, OpTimeoutAbortsTheGroup) {
  TempDir dir;
  auto results = run_workers("op_timeout", 2, file_url(dir), milliseconds(60000), {"1000"});
  expect_all_ok(results);
}

TEST(Processes, MismatchedSizesFailOnEveryRankWithoutTerminate) {
  TempDir dir;
  auto results = run_workers("mismatch", 2, file_url(dir), milliseconds(60000), {"1500"});
  expect_all_ok(results);
  for (const auto& r : results) EXPECT_NE(r.signal, SIGABRT) << r.output;
}

TEST(Processes, ExitWithoutDestroyIsClean) {
  TempDir dir;
  auto results = run_workers("exit_without_destroy", 3, file_url(dir), milliseconds(30000));
  expect_all_ok(results);
}

TEST(Processes, RanksDisagreeingOnWorldSizeBothFailFast) {
  TempDir dir;
  expect_all_ok(run_workers("wrong_world", 2, file_url(dir), milliseconds(60000), {"20000"}));
}

TEST(Processes, RanksWithDifferentGlooSettingsFailAtInit) {
  TempDir dir;
  expect_all_ok(run_workers("gloo_setting", 2, file_url(dir), milliseconds(60000), {"20000"}));
}

// The rank that hosts the TCP store fails its backend: it lets the others read why before its
// departure stops the store, so they fail naming it (the worker checks each message and that it
// came within 5 s).
TEST(Processes, AFailingStoreHostLetsTheOthersReadWhy) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto results = run_workers("host_fails", 3, url, milliseconds(30000), {"20000"});
  expect_all_ok(results);
  // The same while the others are still making their backends (Gloo, waiting for rank 0's
  // addresses in the store): they fail at once, naming rank 0, not at their 20 s timeout.
  const std::string url2 = "tcp://127.0.0.1:" + std::to_string(free_port());
  expect_all_ok(run_workers("host_fails", 3, url2, milliseconds(30000), {"20000", "peers"}));
}

TEST(Processes, TwoProcessesClaimingOneRankFailFast) {
  TempDir dir;
  auto results = run_workers("claim", 2, file_url(dir), milliseconds(30000), {"1500"}, {0, 0});
  expect_all_ok(results);
  int claimed = 0, timed_out = 0;
  for (const auto& r : results) {
    claimed += r.output.find("CLAIMED") != std::string::npos;
    timed_out += r.output.find("TIMEOUT") != std::string::npos;
  }
  EXPECT_EQ(claimed, 1);
  EXPECT_EQ(timed_out, 1);
}

}  // namespace
}  // namespace tutti::testing
