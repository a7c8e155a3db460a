// Fault injection with real processes (issue 10): each scenario of tests/fault_worker.cc ends in
// a named error within its bound, or in the right result: never wrong data, never a hang.
// Figures the workers print ("FIGURE ...") are echoed to the test log; docs/RELIABILITY.md
// quotes them.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

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

// Entries of /dev/shm whose name contains `needle`.
std::vector<std::string> shm_entries(const std::string& needle) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).find(needle) != std::string::npos) found.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return found;
}

// One rank of three dies mid-allreduce (SIGKILL, SIGTERM, exit(1) from another thread,
// abort()): the survivors fail within the transport's detection time, naming it, and the group
// is created again under its name with the rank restarted. Through a TCP store rank 0 hosts.
class Crash : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Crash, SurvivorsFailFastAndTheGroupIsCreatedAgain) {
  const auto& [backend, how] = GetParam();
  const std::string name = unique_name("crashy-" + how);
  auto results = run("crash", 3, "tcp://127.0.0.1:" + std::to_string(free_port()),
                     milliseconds(90000),
                     {"backend=" + backend, "how=" + how, "timeout=20000", "name=" + name,
                      "bound=2000"});
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 0) << "survivor rank " << r << " (signal "
                                       << results[r].signal << "):\n" << results[r].output;
  }
  const int want = how == "kill" ? SIGKILL : how == "term" ? SIGTERM : how == "abort" ? SIGABRT : 0;
  if (want != 0) {
    EXPECT_EQ(results[2].signal, want) << results[2].output;
  } else {
    EXPECT_EQ(results[2].exit_code, 1) << results[2].output;
  }
  expect_all_ok({results[0], results[1]});
  EXPECT_TRUE(shm_entries(name).empty()) << "left in /dev/shm: " << shm_entries(name)[0];
}

INSTANTIATE_TEST_SUITE_P(
    Backends, Crash,
    ::testing::Combine(::testing::Values("gloo", "shm"),
                       ::testing::Values("kill", "term", "exit", "abort")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// A.3: a Gloo rank whose peer dies while it sends is not killed by SIGPIPE (at its default, as
// tutti-run leaves it: the backend ignores it), from 64K to 1M elements, several times.
TEST(CrashSigpipe, GlooSurvivorsOfAPeerDeathAreNeverKilledBySigpipe) {
  for (const char* size : {"65536", "262144", "1048576", "65536", "1048576"}) {
    SCOPED_TRACE(size);
    auto results = run("crash", 3, "tcp://127.0.0.1:" + std::to_string(free_port()),
                       milliseconds(90000),
                       {"backend=gloo", "how=kill", "timeout=20000", std::string("size=") + size,
                        "name=" + unique_name("sigpipe"), "bound=2000"});
    for (int r : {0, 1}) {
      EXPECT_NE(results[r].signal, SIGPIPE) << results[r].output;
      EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
    }
  }
}

}  // namespace
}  // namespace tutti::testing
