// Fault injection with real processes (issue 10): each scenario of tests/fault_worker.cc ends in
// a named error within its bound, or in the right result: never wrong data, never a hang.
// Figures the workers print ("FIGURE ...") are echoed to the test log; docs/RELIABILITY.md
// quotes them.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

std::vector<WorkerResult> run(const std::string& scenario, int world, const std::string& store,
                              milliseconds limit, const std::vector<std::string>& extra = {}) {
  return run_workers_of(TUTTI_FAULT_WORKER, scenario, world, store, limit, extra);
}

// Every rank exited 0; prints the figures they measured.
void expect_all_ok(const std::vector<WorkerResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (signal " << results[r].signal
                                       << "):\n"
                                       << results[r].output;
    std::regex figure("FIGURE [^\n]*");
    for (auto it = std::sregex_iterator(results[r].output.begin(), results[r].output.end(), figure);
         it != std::sregex_iterator(); ++it) {
      std::printf("rank %zu %s\n", r, it->str().c_str());
    }
  }
}

class Faults : public ::testing::TestWithParam<std::string> {
 protected:
  std::string backend() const { return "backend=" + GetParam(); }
};

// A.1-A.3: a forked child cannot use, corrupt or hang on its parent's groups.
TEST_P(Faults, AForkedChildLeavesTheParentsGroupsAlone) {
  // Through a TCP store that rank 0 hosts: the child inherits the server too.
  expect_all_ok(run("fork", 2, "tcp://127.0.0.1:" + std::to_string(free_port()),
                    milliseconds(60000), {backend(), "timeout=10000"}));
}

// A.4: two threads issuing same-signature ops on one group never swap their data.
TEST_P(Faults, TwoThreadsOnOneGroupNeverMixTheirData) {
  TempDir dir;
  expect_all_ok(run("threads", 2, "file://" + dir.path() + "/store", milliseconds(60000),
                    {backend(), "timeout=10000"}));
}

// The flight recorder: ranks 0 and 1 time out in allreduce #5 (their aborts dump), rank 2 never
// called it (SIGUSR1 dumps it); tutti-flight names rank 2 as behind, on allreduce #5.
TEST_P(Faults, TheFlightRecorderShowsWhichRankIsBehind) {
  TempDir dir;
  expect_all_ok(run("flight", 3, "file://" + dir.path() + "/store", milliseconds(60000),
                    {backend(), "timeout=1000", "dir=" + dir.path() + "/flight"}));
  WorkerResult merged = run_command({TUTTI_FLIGHT, dir.path() + "/flight"}, milliseconds(10000));
  EXPECT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_NE(merged.output.find("rank 2 is behind: ranks 0, 1 reached allreduce #5 "
                               "(allreduce float32[1000] sum)"),
            std::string::npos)
      << merged.output;
  EXPECT_NE(merged.output.find("rank 2 has not issued it (its last collective: allreduce #4"),
            std::string::npos)
      << merged.output;
  std::printf("%s", merged.output.c_str());
}

INSTANTIATE_TEST_SUITE_P(Backends, Faults, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
