// tutti-run, and groups joined from each launcher's environment variables.
#include <gtest/gtest.h>

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

WorkerResult tutti_run(const std::vector<std::string>& args,
                       milliseconds limit = milliseconds(60000)) {
  std::vector<std::string> argv = {TUTTI_RUN};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, limit);
}

TEST(Launcher, SetsTheEnvironmentAndPrefixesOutput) {
  auto r = tutti_run({"-n", "3", "--backend", "gloo", "sh", "-c",
                      "echo v $TUTTI_RANK $TUTTI_WORLD_SIZE $TUTTI_LOCAL_RANK "
                      "$TUTTI_LOCAL_WORLD_SIZE $TUTTI_BACKEND $TUTTI_STORE $TUTTI_JOB_ID"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::regex line("\\[" + std::to_string(rank) + "\\]: v " + std::to_string(rank) + " 3 " +
                          std::to_string(rank) +
                          " 3 gloo tcp://127\\.0\\.0\\.1:[0-9]+ [0-9a-f]{16}\\n");
    EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  }
}

TEST(Launcher, FirstFailingRankEndsTheJobWithItsStatus) {
  const auto start = Clock::now();
  auto r = tutti_run({"-n", "3", "sh", "-c", "if [ $TUTTI_RANK = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 3"), std::string::npos) << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));  // the sleepers were stopped
}

TEST(Launcher, MaxFailuresLetsTheOthersGoOn) {
  // One rank may fail: the others finish and the job succeeds.
  auto r = tutti_run({"-n", "3", "--max-failures", "1", "sh", "-c",
                      "if [ $TUTTI_RANK = 1 ]; then kill -KILL $$; fi; sleep 0.5; echo done"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the others go on (1 of --max-failures 1)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[0]: done"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[2]: done"), std::string::npos) << r.output;
  // A second failure ends the job with its status.
  const auto start = Clock::now();
  auto two = tutti_run({"-n", "3", "--max-failures", "1", "sh", "-c",
                        "if [ $TUTTI_RANK = 0 ]; then exit 4; fi; "
                        "if [ $TUTTI_RANK = 1 ]; then sleep 0.3; exit 5; fi; sleep 60"});
  EXPECT_EQ(two.exit_code, 5) << two.output;
  EXPECT_NE(two.output.find("stopping the other ranks"), std::string::npos) << two.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

TEST(Launcher, CrashingRankIsReportedBySignal) {
  auto r = tutti_run(
      {"-n", "2", "sh", "-c", "if [ $TUTTI_RANK = 0 ]; then kill -SEGV $$; fi; sleep 60"});
  EXPECT_EQ(r.exit_code, 128 + 11) << r.output;
  EXPECT_NE(r.output.find("rank 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 11"), std::string::npos) << r.output;
}

TEST(Launcher, TimeoutBoundsTheJob) {
  auto r = tutti_run({"--timeout", "1", "-n", "2", "sleep", "60"});
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_NE(r.output.find("--timeout 1 s"), std::string::npos) << r.output;
}

// A rank that ends leaving a process it started holding its output (here a background sleep)
// does not keep tutti-run waiting for that output: 2 s after the last rank, that process group
// gets SIGTERM, and the job ends with the ranks' status.
TEST(Launcher, ARanksLeftoverProcessDoesNotHoldTheJob) {
  const auto start = Clock::now();
  auto r = tutti_run({"-n", "1", "sh", "-c", "sleep 1000 & echo started"}, milliseconds(60000));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[0]: started"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("processes they started still hold their output; stopping them"),
            std::string::npos)
      << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

// A job whose every rank failed within --max-failures failed: it exits with the last status.
TEST(Launcher, EveryRankFailingWithinMaxFailuresIsAFailedJob) {
  auto one = tutti_run({"--max-failures", "1", "sh", "-c", "exit 3"});
  EXPECT_EQ(one.exit_code, 3) << one.output;
  auto two = tutti_run({"-n", "2", "--max-failures", "2", "false"});
  EXPECT_EQ(two.exit_code, 1) << two.output;
}

// Ranks read stdin as /dev/null (in their own process groups, in the background, a read of the
// terminal would stop them for good); here tutti-run's stdin has a line they must not see.
TEST(Launcher, RanksReadStdinAsDevNull) {
  auto r = run_command({"sh", "-c",
                        "echo secret | '" + std::string(TUTTI_RUN) +
                            "' -n 1 sh -c 'if read x; then echo read:$x; else echo eof; fi'"},
                       milliseconds(60000));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[0]: eof"), std::string::npos) << r.output;
}

// A hangup (the terminal or the ssh session went) ends the ranks as SIGTERM does. The hangup
// comes once both ranks run (so tutti-run has its handlers).
TEST(Launcher, AHangupEndsTheRanks) {
  const auto start = Clock::now();
  TempDir dir;
  const std::string out = dir.path() + "/out";
  auto r = run_command(
      {"sh", "-c",
       "'" + std::string(TUTTI_RUN) + "' -n 2 sh -c 'echo up; exec sleep 60' > '" + out +
           "' 2>&1 & p=$!; i=0; "
           "until [ \"$(grep -c up '" +
           out +
           "')\" = 2 ] || [ $i = 200 ]; do "
           "sleep 0.05; i=$((i+1)); done; kill -HUP $p; wait $p; "
           "echo status:$?; cat '" +
           out + "'"},
      milliseconds(60000));
  EXPECT_NE(r.output.find("got signal 1; stopping the ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("status:129"), std::string::npos) << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

// The job's store's sockets are not inherited by the ranks (they kept its port after tutti-run
// was gone).
TEST(Launcher, RanksInheritNoSocketOfTheStore) {
  auto r = tutti_run({"-n", "1", "sh", "-c", "ls -l /proc/$$/fd"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipe:"), std::string::npos) << r.output;  // the listing is there
  EXPECT_EQ(r.output.find("socket:"), std::string::npos) << r.output;
}

// "0-2,5" as the set {0, 1, 2, 5}.
std::set<int> cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.insert(c);
  }
  return cpus;
}

// Each rank's allowed CPUs, from its /proc/self/status, by rank.
std::map<int, std::set<int>> cpus_of_ranks(const WorkerResult& r) {
  std::map<int, std::set<int>> out;
  const std::regex line("\\[([0-9]+)\\]: Cpus_allowed_list:\\s*([0-9,-]+)");
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it) {
    out[std::stoi((*it)[1])] = cpu_list((*it)[2]);
  }
  return out;
}

// Several ranks that fit on the launcher's CPUs get disjoint shares of them by default (two
// ranks on one core wait for each other's turn at every step); --bind-to none leaves each all of
// them; --bind-to core with more ranks than CPUs is refused.
TEST(Launcher, BindsEachRankToItsOwnShareOfTheCpus) {
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) allowed.insert(c);
  }
  const std::vector<std::string> show = {"sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), show.begin(), show.end());
    return args;
  };
  auto none = tutti_run(with({"-n", "2", "--bind-to", "none"}));
  ASSERT_EQ(none.exit_code, 0) << none.output;
  for (const auto& [rank, cpus] : cpus_of_ranks(none)) EXPECT_EQ(cpus, allowed) << rank;
  auto refused = tutti_run(with({"-n", std::to_string(allowed.size() + 1), "--bind-to", "core"}));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--bind-to core"), std::string::npos) << refused.output;
  if (allowed.size() < 2) GTEST_SKIP() << "one CPU: two ranks cannot have shares of their own";
  const int n = static_cast<int>(std::min<size_t>(allowed.size(), 3));
  auto bound = tutti_run(with({"-n", std::to_string(n)}));
  ASSERT_EQ(bound.exit_code, 0) << bound.output;
  const auto shares = cpus_of_ranks(bound);
  ASSERT_EQ(shares.size(), static_cast<size_t>(n)) << bound.output;
  std::set<int> all;
  for (const auto& [rank, cpus] : shares) {
    EXPECT_FALSE(cpus.empty()) << rank;
    for (int c : cpus) {
      EXPECT_TRUE(all.insert(c).second) << "CPU " << c << " is in two ranks' shares:\n"
                                        << bound.output;
    }
  }
  EXPECT_EQ(all, allowed) << bound.output;
}

TEST(Launcher, BadOptionsExit2) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"-n", "zero", "true"},
                                             {"--bogus", "true"},
                                             {"-n", "2"},
                                             {"--nnodes", "2", "--node-rank", "2", "true"}}) {
    auto r = tutti_run(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.output;
  }
}

TEST(Launcher, AJobsStoreRefusesClientsThatDoNotKnowItsSecret) {
  // With one node tutti-run makes a random secret for the job's store and gives it to its ranks;
  // a process that was not given it (another user's, on this host) cannot use the store.
  char dir_template[] = "/tmp/tutti-launcher-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  WorkerResult job;
  // The job (and its store) lives until this test writes done: only after both clients below
  // have tried the store, and on every way out of the test (an ASSERT returns early, a store
  // error throws), so the thread is always joined.
  struct Job {
    std::string done;
    std::thread thread;
    void finish() {
      if (!thread.joinable()) return;
      std::ofstream(done).put('\n');
      thread.join();
    }
    ~Job() { finish(); }
  } running{dir + "/done", std::thread([&] {
              job = tutti_run(
                  {"-n", "2", "sh", "-c",
                   "if [ $TUTTI_RANK = 0 ]; then echo \"$TUTTI_STORE $TUTTI_STORE_SECRET\" > " +
                       dir + "/store.tmp && mv " + dir + "/store.tmp " + dir +
                       "/store; fi; while [ ! -e " + dir + "/done ]; do sleep 0.02; done"});
            })};
  std::string url, secret;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(dir + "/store");
    if (in >> url >> secret) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_FALSE(url.empty()) << "rank 0 never wrote its store's address";
  EXPECT_EQ(secret.size(), 64u) << secret;  // 32 random bytes in hex
  const std::smatch m = [&] {
    std::smatch out;
    std::regex_match(url, out, std::regex("tcp://127\\.0\\.0\\.1:([0-9]+)"));
    return out;
  }();
  ASSERT_EQ(m.size(), 2u) << url;
  const auto port = static_cast<uint16_t>(std::stoi(m[1]));
  TCPStoreOptions wrong;
  wrong.timeout = milliseconds(3000);
  try {
    TCPStore outsider("127.0.0.1", port, wrong);
    outsider.set("k", "v");
    ADD_FAILURE() << "a client without the job's secret used its store";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("secret"), std::string::npos) << e.what();
  }
  TCPStoreOptions right = wrong;
  right.secret = secret;
  TCPStore member("127.0.0.1", port, right);
  member.set("k", "v");
  EXPECT_EQ(member.get("k"), "v");
  running.finish();
  EXPECT_EQ(job.exit_code, 0) << job.output;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, GroupsFromTuttiRun) {
  auto r = tutti_run({"-n", "4", TUTTI_TEST_WORKER, "env_allreduce"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("[" + std::to_string(rank) + "]: env rank " + std::to_string(rank) +
                            " of 4 local " + std::to_string(rank) + "/4: sum 10"),
              std::string::npos)
        << r.output;
  }
}

TEST(Launcher, TwoNodesOnOneHost) {
  // Node 0 serves the store on a fixed port; node 1 connects to it.
  const std::string port = std::to_string(free_port());
  std::vector<std::string> base = {
      TUTTI_RUN,   "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "--job-id",
      "two-nodes", "-n",       "2"};
  auto node0 = base;
  node0.insert(node0.end(), {"--node-rank", "0", TUTTI_TEST_WORKER, "env_allreduce"});
  auto node1 = base;
  node1.insert(node1.end(), {"--node-rank", "1", TUTTI_TEST_WORKER, "env_allreduce"});
  std::vector<WorkerResult> results(2);
  std::thread t([&] { results[1] = run_command(node1, milliseconds(60000)); });
  results[0] = run_command(node0, milliseconds(60000));
  t.join();
  // Without TUTTI_STORE_SECRET in the environment the nodes cannot share a secret: node 0 says
  // its store is open.
  EXPECT_NE(results[0].output.find("the store has no secret"), std::string::npos)
      << results[0].output;
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("of 4 local"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("sum 10"), std::string::npos) << r.output;
  }
}

// The same worker, launched the way torchrun, srun and mpirun would set its environment.
void run_with_env(const std::function<std::vector<std::string>(int rank)>& env_of, int world) {
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < world; ++r) envs.push_back(env_of(r));
  auto results = run_processes({TUTTI_TEST_WORKER, "env_allreduce"}, envs, milliseconds(60000));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].output;
    EXPECT_NE(
        results[r].output.find("env rank " + std::to_string(r) + " of " + std::to_string(world)),
        std::string::npos)
        << results[r].output;
  }
}

TEST(LaunchEnvironments, Torchrun) {
  const std::string port = std::to_string(free_port());
  run_with_env(
      [&](int r) {
        return std::vector<std::string>{"RANK=" + std::to_string(r),       "WORLD_SIZE=3",
                                        "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=3",
                                        "MASTER_ADDR=127.0.0.1",           "MASTER_PORT=" + port,
                                        "TORCHELASTIC_RUN_ID=t1"};
      },
      3);
}

TEST(LaunchEnvironments, Slurm) {
  const std::string port = std::to_string(free_port());
  run_with_env(
      [&](int r) {
        return std::vector<std::string>{"SLURM_PROCID=" + std::to_string(r),
                                        "SLURM_NTASKS=2",
                                        "SLURM_LOCALID=" + std::to_string(r),
                                        "SLURM_JOB_NODELIST=localhost",
                                        "SLURM_JOB_ID=77",
                                        "MASTER_PORT=" + port};
      },
      2);
}

TEST(LaunchEnvironments, OpenMpi) {
  const std::string port = std::to_string(free_port());
  run_with_env(
      [&](int r) {
        return std::vector<std::string>{"OMPI_COMM_WORLD_RANK=" + std::to_string(r),
                                        "OMPI_COMM_WORLD_SIZE=2",
                                        "OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(r),
                                        "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port};
      },
      2);
}

TEST(LaunchEnvironments, RealMpirun) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) {
    GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  }
  const std::string port = std::to_string(free_port());
  std::vector<std::string> argv = {"/usr/bin/mpirun",
                                   "--oversubscribe",
                                   "-np",
                                   "3",
                                   "-x",
                                   "MASTER_ADDR=127.0.0.1",
                                   "-x",
                                   "MASTER_PORT=" + port,
                                   TUTTI_TEST_WORKER,
                                   "env_allreduce"};
  if (::geteuid() == 0) argv.insert(argv.begin() + 1, "--allow-run-as-root");
  auto r = run_command(argv, milliseconds(60000));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.output.find("env rank " + std::to_string(rank) + " of 3 local " +
                            std::to_string(rank) + "/3: sum 6"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace tutti::testing
