// The shm backend as real processes: what it leaves in /dev/shm, crashes, hosts, and "auto".
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "../backends/shm/shm_slice.h"
#include "slice_skip.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// Runs the env_backend worker as `world` ranks with the given backend and per-rank extras.
std::vector<WorkerResult> run_ranks_env(int world, const std::string& backend,
                                        const std::string& job,
                                        const std::function<std::vector<std::string>(int)>& extra,
                                        const TempDir& dir,
                                        const std::string& scenario = "env_backend") {
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env = {"TUTTI_RANK=" + std::to_string(r),
                                    "TUTTI_WORLD_SIZE=" + std::to_string(world),
                                    "TUTTI_STORE=file://" + dir.path() + "/store",
                                    "TUTTI_JOB_ID=" + job, "TUTTI_BACKEND=" + backend};
    for (auto& e : extra(r)) env.push_back(e);
    envs.push_back(env);
  }
  return run_processes({TUTTI_TEST_WORKER, scenario}, envs, milliseconds(60000));
}

TEST(ShmProcesses, NothingIsLeftInDevShm) {
  TempDir dir;
  const std::string job = unique_name("shmjob");
  auto results = run_ranks_env(
      4, "shm", job, [](int) { return std::vector<std::string>{}; }, dir);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("backend shm"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(shm_entries(job).empty()) << "left behind: " << shm_entries(job)[0];
}

// The survivors notice the death through the process handle well before the op's 1.5 s
// timeout: the worker checks that the error (kIoError, or kRemoteError when the other survivor
// noticed first and aborted) names rank 1, and times it from the death (rank 1 writes when).
TEST(ShmProcesses, ACrashedRankIsNamedAndLeavesNothingBehind) {
  TempDir dir;
  const std::string job = unique_name("shmcrash");
  auto results = run_ranks_env(
      3, "shm", job,
      [&](int) {
        return std::vector<std::string>{"TUTTI_TEST_CRASH_RANK=1",
                                        "TUTTI_TEST_DEATH=" + dir.path() + "/death"};
      },
      dir);
  EXPECT_EQ(results[1].signal, SIGABRT) << results[1].output;
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].output;
    EXPECT_NE(results[r].output.find("naming rank 1"), std::string::npos) << results[r].output;
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(results[r].output, m, std::regex("failed ([0-9.]+) ms after the death")))
        << results[r].output;
    EXPECT_LT(std::stod(m[1]), 1000) << results[r].output;
  }
  EXPECT_TRUE(shm_entries(job).empty()) << "left behind: " << shm_entries(job)[0];
}

TEST(ShmProcesses, RanksOnDifferentHostsAreRefused) {
  TempDir dir;
  auto results = run_ranks_env(
      2, "shm", unique_name("hosts"),
      [](int r) { return std::vector<std::string>{"TUTTI_HOST_ID=host-" + std::to_string(r)}; },
      dir);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("the shm backend needs every rank on one host"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("host-0"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("host-1"), std::string::npos) << r.output;
  }
}

TEST(ShmProcesses, AutoPicksShmOnOneHostGlooAcrossHostsAndHierBetween) {
  {
    TempDir dir;
    auto same = run_ranks_env(
        3, "auto", unique_name("auto1"), [](int) { return std::vector<std::string>{}; }, dir);
    for (const auto& r : same) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("backend shm"), std::string::npos) << r.output;
    }
  }
  {
    TempDir dir;
    auto apart = run_ranks_env(
        2, "auto", unique_name("auto2"),
        [](int r) { return std::vector<std::string>{"TUTTI_HOST_ID=node-" + std::to_string(r)}; },
        dir);
    for (const auto& r : apart) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("backend gloo"), std::string::npos) << r.output;
    }
  }
  // Several hosts, two ranks on one: the two levels.
  TempDir dir;
  auto shared = run_ranks_env(
      3, "auto", unique_name("auto3"),
      [](int r) { return std::vector<std::string>{"TUTTI_HOST_ID=node-" + std::to_string(r % 2)}; },
      dir);
  for (const auto& r : shared) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("backend hier"), std::string::npos) << r.output;
  }
}

// hier on layouts of hosts (TUTTI_HOST_ID makes a process another "host"): every op checked
// against values the worker computes from the inputs. Layouts by rank: two hosts of two ranks,
// hosts interleaved and uneven (a b a b a), one host (no leaders' level), and a host per rank (no
// local level).
TEST(HierProcesses, EveryOpOnLayoutsOfHosts) {
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "b", "a", "b", "a"}, {"a", "a", "a"}, {"a", "b", "c"}};
  for (const auto& hosts : layouts) {
    std::string layout;
    for (const auto& h : hosts) layout += h;
    TempDir dir;
    auto results = run_ranks_env(
        static_cast<int>(hosts.size()), "hier", unique_name("hier-" + layout),
        [&](int r) { return std::vector<std::string>{"TUTTI_HOST_ID=host-" + hosts[r]}; }, dir,
        "env_every_op");
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << "layout " << layout << ", rank " << r << ":\n"
                                         << results[r].output;
      EXPECT_NE(results[r].output.find("every op checked"), std::string::npos)
          << "layout " << layout << ", rank " << r << ":\n"
          << results[r].output;
    }
  }
}

// Symmetric memory under hier: two hosts of two ranks and one alone (a a b b c). Every rank's
// memory is symmetric, and each two-rank host's levels take their single-copy paths (the shm
// level's debug lines: its reduce to the host's leader and its broadcast from it); the results
// are checked by the worker.
TEST(HierProcesses, SymmetricMemoryTakesTheHostLevelsSingleCopyPaths) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c"};
  TempDir dir;
  auto results = run_ranks_env(
      5, "hier", unique_name("hier-sym"),
      [&](int r) {
        return std::vector<std::string>{"TUTTI_HOST_ID=host-" + hosts[r], "TUTTI_LOG_LEVEL=debug"};
      },
      dir, "env_symmetric");
  for (size_t r = 0; r < results.size(); ++r) {
    const std::string& out = results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("backend hier symmetric 1"), std::string::npos) << out;
    EXPECT_NE(out.find("symmetric ops checked"), std::string::npos) << out;
    // The paired hosts' ranks both read in the host level's reduce; the non-leaders (1, 3)
    // read their leader's tensor in its broadcast; the lone rank has no host level.
    const bool paired = hosts[r] != "c";
    const bool reads_reduce = out.find("shm: reduce #") != std::string::npos &&
                              out.find(": single copy, rank ") != std::string::npos;
    const bool reads_broadcast = out.find("shm: broadcast #") != std::string::npos;
    EXPECT_EQ(reads_reduce, paired) << "rank " << r << ":\n" << out;
    EXPECT_EQ(reads_broadcast, r == 1 || r == 3) << "rank " << r << ":\n" << out;
  }
}

// A rank that cannot make its part (its files may not grow to the region's size) takes part in
// the exchange with none: every rank gets ordinary memory, none waits for it, the ops work, and
// the warnings say why.
TEST(ShmProcesses, ARankThatCannotMakeItsPartLeavesEveryRankOrdinaryMemory) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  auto results = run_ranks_env(
      3, "shm", unique_name("sym-fail"),
      [](int) { return std::vector<std::string>{"TUTTI_TEST_SYMMETRIC_FSIZE_RANK=1"}; }, dir,
      "env_symmetric");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  for (size_t r = 0; r < results.size(); ++r) {
    const std::string& out = results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("backend shm symmetric 0"), std::string::npos) << out;
    EXPECT_NE(out.find("symmetric ops checked"), std::string::npos) << out;
    EXPECT_NE(out.find(r == 1 ? "reserving" : "rank(s) 1 could not make their part"),
              std::string::npos)
        << "rank " << r << ":\n"
        << out;
  }
}

// The files of symmetric memory a dead process left in /dev/shm are removed by the next process
// that makes some, where that process is of this pid namespace; a file of another namespace
// (containers sharing /dev/shm under one uid) is left whatever its pid says here, and so is one
// named before names carried the namespace. Before, each process removed every file of the uid
// whose pid was not alive in its own namespace: another container's live memory too.
TEST(ShmProcesses, TheSymmetricSweepRemovesOnlyItsOwnNamespacesDeadFiles) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);    // its pid names no process now
  const std::string mine = symmetric_file_prefix();  // "...-n<ns>-<this pid>-"
  const std::string uid_part = "tutti-sym-" + std::to_string(::getuid()) + "-";
  const std::string ns =
      mine.substr(uid_part.size() + 1, mine.find('-', uid_part.size()) - uid_part.size() - 1);
  const std::string dead = std::to_string(child);
  const std::string ours = uid_part + "n" + ns + "-" + dead + "-1-" + unique_name("t");
  const std::string theirs =
      uid_part + "n" + std::to_string(std::stoull(ns) + 1) + "-" + dead + "-1-" + unique_name("t");
  const std::string old_style = uid_part + dead + "-1-" + unique_name("t");
  for (const std::string& name : {ours, theirs, old_style}) {
    const int fd = ::open(("/dev/shm/" + name).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << name << ": " << std::strerror(errno);
    ::close(fd);
  }
  TempDir dir;
  auto results = run_ranks_env(
      2, "shm", unique_name("sym-sweep"), [](int) { return std::vector<std::string>{}; }, dir,
      "env_symmetric");
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("backend shm symmetric 1"), std::string::npos)
        << results[r].output;
  }
  auto exists = [](const std::string& name) {
    return ::access(("/dev/shm/" + name).c_str(), F_OK) == 0;
  };
  EXPECT_FALSE(exists(ours)) << ours << " (a dead process's, of this namespace) was left";
  EXPECT_TRUE(exists(theirs)) << theirs << " (another namespace's) was removed";
  EXPECT_TRUE(exists(old_style)) << old_style << " (of no known namespace) was removed";
  for (const std::string& name : {ours, theirs, old_style}) ::unlink(("/dev/shm/" + name).c_str());
}

// A rank that dies under hier (two hosts of two ranks; rank 3 is not a leader): its host's
// leader notices through shm and names it by the group's numbering, and the others learn of it
// from the leaders' level or their leader's abort, each within seconds, not at the timeout.
TEST(HierProcesses, ACrashedRankIsNoticedOnEveryLevel) {
  TempDir dir;
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  auto results = run_ranks_env(
      4, "hier", unique_name("hier-crash"),
      [&](int r) {
        return std::vector<std::string>{"TUTTI_HOST_ID=host-" + hosts[r],
                                        "TUTTI_TEST_CRASH_RANK=3"};
      },
      dir, "env_crash_noticed");
  EXPECT_EQ(results[3].signal, SIGABRT) << results[3].output;
  for (int r : {0, 1, 2}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("noticed in"), std::string::npos) << results[r].output;
  }
  // Rank 2 shares host b with the dead rank: shm's message numbers it 1 on that level, and the
  // legend says which rank of the group that is.
  EXPECT_NE(results[2].output.find("died"), std::string::npos) << results[2].output;
  EXPECT_NE(results[2].output.find("ranks 0, 1 are ranks 2, 3 of group"), std::string::npos)
      << results[2].output;
}

// A rank that never calls an op under hier (hosts a a b; rank 2, host b's only rank, is silent,
// and rank 1 calls 300 ms late, so host a's leader begins the leaders' level with ~600 ms of the
// op's 900 left): ranks 0 and 1 fail with kTimeout near the op's deadline, and each message gives
// the op's timeout, not only what a level had left of it.
TEST(HierProcesses, ALevelsTimeoutNamesTheOpsTimeout) {
  TempDir dir;
  const std::vector<std::string> hosts = {"a", "a", "b"};
  auto results = run_ranks_env(
      3, "hier", unique_name("hier-silent"),
      [&](int r) {
        return std::vector<std::string>{"TUTTI_HOST_ID=host-" + hosts[r],
                                        "TUTTI_TEST_SILENT_RANK=2", "TUTTI_TEST_LATE_RANK=1",
                                        "TUTTI_TEST_STARTS=" + dir.path()};
      },
      dir, "env_silent_rank");
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("timed out in"), std::string::npos) << results[r].output;
  }
  EXPECT_EQ(results[2].exit_code, 0) << results[2].output;
}

// A /dev/shm too small for the group (an 8 MiB tmpfs in a mount namespace of its own): where
// the collectives' part of the segment does not fit (16 MiB chunks: 64 MiB of staging), the
// group's creation fails by name; where only the point-to-point mailboxes do not (4 MiB ones:
// 32 MiB), the group is made and the first send fails by name. tmpfs does not reserve a file's
// pages when it is sized: before, creation succeeded and the first touch of a page past the room
// killed the rank with SIGBUS.
TEST(ShmProcesses, ADevShmWithoutRoomFailsByName) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small /dev/shm needs root";
  const std::string mount =
      "mount --make-rprivate / && mount -t tmpfs -o size=8m tmpfs /dev/shm || exit 77; ";
  const std::string run = "exec " TUTTI_RUN " -n 2 --backend shm " TUTTI_TEST_WORKER " ";
  auto made = run_command({"unshare", "-m", "sh", "-c", mount + run + "env_allreduce"},
                          milliseconds(60000), {"TUTTI_SHM_CHUNK_BYTES=16777216"});
  if (made.exit_code == 77) GTEST_SKIP() << "cannot mount a tmpfs here: " << made.output;
  EXPECT_NE(made.exit_code, 0) << made.output;
  EXPECT_EQ(made.output.find("signal 7"), std::string::npos) << made.output;
  EXPECT_NE(made.output.find("reserving the group's segment of"), std::string::npos) << made.output;
  EXPECT_NE(made.output.find("give /dev/shm more room"), std::string::npos) << made.output;
  auto sent = run_command({"unshare", "-m", "sh", "-c", mount + run + "env_sendrecv"},
                          milliseconds(60000), {"TUTTI_SHM_MAILBOX_BYTES=4194304"});
  EXPECT_NE(sent.exit_code, 0) << sent.output;
  EXPECT_EQ(sent.output.find("signal 7"), std::string::npos) << sent.output;
  EXPECT_NE(sent.output.find("/dev/shm has no room for the mailbox of ranks"), std::string::npos)
      << sent.output;
  // The same with room: the exchange works.
  auto roomy =
      run_command({"unshare", "-m", "sh", "-c", mount + run + "env_sendrecv"}, milliseconds(60000));
  EXPECT_EQ(roomy.exit_code, 0) << roomy.output;
  EXPECT_NE(roomy.output.find("p2p checked"), std::string::npos) << roomy.output;
}

// Ranks whose segments are the same size but laid out differently (here staging chunks and
// mailboxes that sum to the same 8 MiB: 4 x 1 MiB + 8 x 512 KiB against 4 x 1.5 MiB + 8 x 256
// KiB; ranks of two builds whose structures differ are the other way there) fail at creation,
// by name, with both layouts: before, the size check let them through to read each other's words
// at the wrong offsets.
TEST(ShmProcesses, RanksThatLayTheSegmentOutDifferentlyFailByName) {
  TempDir dir;
  auto results = run_ranks_env(
      2, "shm", unique_name("shm-layout"),
      [&](int r) {
        return r == 0 ? std::vector<std::string>{"TUTTI_SHM_CHUNK_BYTES=1048576",
                                                 "TUTTI_SHM_MAILBOX_BYTES=524288"}
                      : std::vector<std::string>{"TUTTI_SHM_CHUNK_BYTES=1572864",
                                                 "TUTTI_SHM_MAILBOX_BYTES=262144"};
      },
      dir);
  EXPECT_NE(results[1].exit_code, 0) << results[1].output;
  EXPECT_NE(results[1].output.find("shm: rank 0 lays the group's segment"), std::string::npos)
      << results[1].output;
  EXPECT_NE(results[1].output.find("chunk 1048576, mailbox 524288"), std::string::npos)
      << results[1].output;
  EXPECT_NE(results[1].output.find("chunk 1572864, mailbox 262144"), std::string::npos)
      << results[1].output;
  // Rank 0's group cannot be made either, and it says why.
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("failed on rank 1: shm: rank 0 lays"), std::string::npos)
      << results[0].output;
}

// TUTTI_SHM_CHUNK_BYTES past what strtoull can hold (or 0, or negative) falls back to the default
// with a warning: it wrapped to a chunk of 0 bytes, and a broadcast looped forever.
TEST(ShmThreads, AChunkSizeOutOfRangeFallsBackToTheDefault) {
  for (const char* bad : {"99999999999999999999", "0", "-4096", "4611686018427387904"}) {
    SCOPED_TRACE(bad);
    ::setenv("TUTTI_SHM_CHUNK_BYTES", bad, 1);
    auto groups = create_groups(2, "shm", unique_name("shm-bad-chunk"));
    ::unsetenv("TUTTI_SHM_CHUNK_BYTES");
    run_ranks(2, [&](int r) {
      std::vector<int32_t> v(3 << 16, r == 0 ? 7 : 0);  // 768 KiB
      groups[r]->broadcast(v);
      EXPECT_EQ(v[(3 << 16) - 1], 7);
      std::vector<float> big(1 << 19, static_cast<float>(r + 1));  // 2 MiB
      groups[r]->allreduce(big);
      EXPECT_EQ(big[(1 << 19) - 1], 3.0f);
    });
  }
}

// shm groups whose ways are chosen by timing (TUTTI_SHM_PUBLISH unset: a fixed way times nothing).
std::vector<std::shared_ptr<CollectiveGroup>> choosing_groups(int world, const std::string& name) {
  ::unsetenv("TUTTI_SHM_PUBLISH");
  return create_groups(world, "shm", unique_name(name));
}

// A broadcast's way is its root's alone, timed on some ops of its size class (the first five,
// then probes): a timed one ends with one more barrier, which the other ranks learn of from the
// root. With the root going round, each rank's count of the class differs from the others', and
// every broadcast still arrives whole (a rank that missed the barrier would leave the others
// waiting for their timeout). Each rank is root of 6-7 broadcasts of each size: ops 0-6 of its
// classes, of which 2-4 are timed (shm_publish.cc's warm-up; both sizes are over kMinBytes).
TEST(ShmThreads, BroadcastsFromEveryRootInTurnOnTimedAndUntimedOps) {
  constexpr int kWorld = 3;
  auto groups = choosing_groups(kWorld, "shm-bcast-roots");
  run_ranks(kWorld, [&](int r) {
    for (int i = 0; i < 40; ++i) {
      const int root = i % kWorld;
      const size_t n = (i % 2 == 0 ? 1 : 3) << 18;  // 1 MiB (one chunk) or 3 MiB
      std::vector<int32_t> v(n, r == root ? 100 * i + root : -1);
      BroadcastOptions opts;
      opts.root_rank = root;
      groups[r]->broadcast(v, opts);
      ASSERT_EQ(v.front(), 100 * i + root) << "broadcast " << i << " on rank " << r;
      ASSERT_EQ(v[n / 2], 100 * i + root) << "broadcast " << i << " on rank " << r;
      ASSERT_EQ(v.back(), 100 * i + root) << "broadcast " << i << " on rank " << r;
    }
  });
}

// The one-step path's allreduce and allgather from 8 KiB time ordinary against streaming stores
// into the ranks' slots on some ops (the first five of a size class, then probes at 8, 16, 32,
// 64 and every 128th), as do broadcasts over 8 KiB (staged): every op, timed or not, on either
// way, gives every rank the exact result.
TEST(ShmThreads, SmallOpsGiveExactResultsAcrossTheChoosersTimedOps) {
  constexpr int kWorld = 3;
  auto groups = choosing_groups(kWorld, "shm-small-ways");
  run_ranks(kWorld, [&](int r) {
    for (int i = 0; i < 300; ++i) {
      const size_t n = i % 3 == 0 ? 4096 : 2048;  // 16 KiB or 8 KiB of int32
      std::vector<int32_t> v(n);
      for (size_t k = 0; k < n; ++k) v[k] = static_cast<int32_t>(1000 * r + i + k);
      groups[r]->allreduce(v);
      // sum over r of (1000 r + i + k) = 1000 (0 + 1 + 2) + 3 (i + k)
      for (size_t k : {size_t{0}, n / 2 + 1, n - 1}) {
        ASSERT_EQ(v[k], static_cast<int32_t>(3000 + 3 * (i + k))) << "op " << i << " rank " << r;
      }
      std::vector<int32_t> mine(2048, 10 * i + r);
      std::vector<int32_t> all(2048 * kWorld, -1);
      groups[r]->allgather(all, mine);
      for (int q = 0; q < kWorld; ++q) {
        ASSERT_EQ(all[2048 * q], 10 * i + q) << "op " << i << " rank " << r;
        ASSERT_EQ(all[2048 * q + 2047], 10 * i + q) << "op " << i << " rank " << r;
      }
      // Broadcasts over 8 KiB go staged, the root's way timed: 16 KiB and an odd 12 KiB + 4 B,
      // from each root in turn.
      const int root = i % kWorld;
      std::vector<int32_t> b(i % 2 == 0 ? 4096 : 3073, r == root ? 7 * i + root : -1);
      BroadcastOptions opts;
      opts.root_rank = root;
      groups[r]->broadcast(b, opts);
      ASSERT_EQ(b.front(), 7 * i + root) << "broadcast " << i << " rank " << r;
      ASSERT_EQ(b.back(), 7 * i + root) << "broadcast " << i << " rank " << r;
    }
  });
}

// The first CPU of `all` alone.
cpu_set_t first_cpu_of(const cpu_set_t& all) {
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  return one;
}

// Pins the calling thread to `mask` while it lives, then gives it `all` back however the scope
// ends (a spawn that throws included), so that no later test runs on one CPU.
class PinnedTo {
 public:
  PinnedTo(const cpu_set_t& mask, const cpu_set_t& all)
      : all_(all), ok_(::sched_setaffinity(0, sizeof mask, &mask) == 0) {}
  ~PinnedTo() { ::sched_setaffinity(0, sizeof all_, &all_); }
  PinnedTo(const PinnedTo&) = delete;
  PinnedTo& operator=(const PinnedTo&) = delete;
  bool ok() const { return ok_; }

 private:
  cpu_set_t all_;
  bool ok_;
};

// Ranks that outnumber their CPUs sleep in their waits, and each waiting thread asks for 100 us
// slices (TUTTI_SHM_SLICE_US), so that a wake-up preempts another busy process: beside two CPU
// hogs, 8 B-32 KiB allreduces at 4 ranks on 2 CPUs took 8 ms each without them and 3-5 us with
// them (backends/shm/shm_slice.h). TUTTI_SHM_SLICE_US=0 leaves the threads' slices as they were
// (as do ranks with a core each, not tested here: other tests' processes on the CPUs count too).
TEST(ShmThreads, RanksThatOutnumberTheirCpusAskForShortSlices) {
  const uint64_t usual = shm_backend::current_slice_ns();
  const std::string why_not = why_slices_cannot_be_tested(250'000);  // it asks for 250 us
  if (!why_not.empty()) GTEST_SKIP() << why_not;
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  // Every rank on one CPU: the group is oversubscribed (its ranks' threads inherit the mask).
  const cpu_set_t one = first_cpu_of(all);
  auto slices_after_an_op = [&](const char* slice_us, const cpu_set_t& mask) {
    // Each rank's thread is new (run_ranks), with the slice it inherits from this one.
    if (slice_us != nullptr) ::setenv("TUTTI_SHM_SLICE_US", slice_us, 1);
    std::vector<std::shared_ptr<CollectiveGroup>> groups;
    bool pinned = false;
    {
      const PinnedTo pin(mask, all);
      pinned = pin.ok();
      if (pinned) groups = create_groups(2, "shm", unique_name("shm-slice"));
    }
    std::vector<uint64_t> slices(2);
    if (!pinned || groups[0] == nullptr || groups[1] == nullptr) {
      ::unsetenv("TUTTI_SHM_SLICE_US");
      ADD_FAILURE() << (pinned ? "no group" : "could not pin the ranks to one CPU");
      return slices;
    }
    run_ranks(2, [&](int r) {
      std::vector<float> v(1024, static_cast<float>(r + 1));
      for (int i = 0; i < 10; ++i) groups[r]->allreduce(v);
      EXPECT_EQ(v[1023], 3.0f * 1024.0f / 2.0f);
      slices[r] = shm_backend::current_slice_ns();
    });
    // Only now: a group reads its settings again where the processes beside it change.
    ::unsetenv("TUTTI_SHM_SLICE_US");
    return slices;
  };
  EXPECT_EQ(slices_after_an_op(nullptr, one), (std::vector<uint64_t>{100'000, 100'000}));
  EXPECT_EQ(slices_after_an_op("250", one), (std::vector<uint64_t>{250'000, 250'000}));
  EXPECT_EQ(slices_after_an_op("0", one), (std::vector<uint64_t>{usual, usual}));
  EXPECT_EQ(shm_backend::current_slice_ns(), usual);
}

// The same with each rank its own process, as users run them (each inherits the slice and the
// CPU mask of the test, which forks it): the slice each rank's thread has after its ops.
TEST(ShmProcesses, RanksThatOutnumberTheirCpusAskForShortSlices) {
  const uint64_t usual = shm_backend::current_slice_ns();
  const std::string why_not = why_slices_cannot_be_tested(250'000);  // it asks for 250 us
  if (!why_not.empty()) GTEST_SKIP() << why_not;
  ASSERT_EQ(std::getenv("TUTTI_SHM_SLICE_US"), nullptr) << "the test sets it per rank";
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  const cpu_set_t one = first_cpu_of(all);
  // Each rank's "slice before X after Y" (ns), -1 where it did not say.
  auto slices_after_ops = [&](const std::vector<std::string>& extra) {
    TempDir dir;
    std::vector<std::pair<int64_t, int64_t>> slices;
    std::vector<WorkerResult> results;
    {
      const PinnedTo pin(one, all);
      if (!pin.ok()) {
        ADD_FAILURE() << "could not pin the ranks to one CPU";
        return slices;
      }
      results = run_ranks_env(
          2, "shm", unique_name("slicejob"), [&](int) { return extra; }, dir, "env_slice");
    }
    for (const auto& r : results) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      std::smatch m;
      if (std::regex_search(r.output, m,
                            std::regex("backend shm slice before ([0-9]+) after ([0-9]+)"))) {
        slices.emplace_back(std::stoll(m[1]), std::stoll(m[2]));
      } else {
        ADD_FAILURE() << "no slice in: " << r.output;
        slices.emplace_back(-1, -1);
      }
    }
    return slices;
  };
  const auto u = static_cast<int64_t>(usual);
  using Slices = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(slices_after_ops({}), (Slices{{u, 100'000}, {u, 100'000}}));
  EXPECT_EQ(slices_after_ops({"TUTTI_SHM_SLICE_US=250"}), (Slices{{u, 250'000}, {u, 250'000}}));
  EXPECT_EQ(slices_after_ops({"TUTTI_SHM_SLICE_US=0"}), (Slices{{u, u}, {u, u}}));
}

TEST(ShmThreads, TwoJobsWithoutJobIdsShareAGroupName) {
  // Separate stores, the same group name and incarnation: segment names must not collide.
  auto a = create_groups(2, "shm", "same-name", std::chrono::seconds(20));
  auto b = create_groups(2, "shm", "same-name", std::chrono::seconds(20));
  run_ranks(2, [&](int r) {
    std::vector<int32_t> va(10, r + 1), vb(10, 10 * (r + 1));
    a[r]->allreduce(va);
    b[r]->allreduce(vb);
    EXPECT_EQ(va[0], 3);
    EXPECT_EQ(vb[0], 30);
  });
}

TEST(ShmThreads, DestroyedGroupsLeaveNothingBehind) {
  const std::string name = unique_name("shm-threads");
  auto groups = create_groups(4, "shm", name);
  run_ranks(4, [&](int r) {
    std::vector<double> v(5000, r);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[4999], 6.0);
    groups[r]->destroy();
  });
  EXPECT_TRUE(shm_entries(name).empty());
}

TEST(ShmThreads, MismatchedOpsFailWithRemoteErrorNamingTheRank) {
  auto groups = create_groups(2, "shm", unique_name("shm-mismatch"), milliseconds(5000));
  run_ranks(2, [&](int r) {
    std::vector<float> v(r == 0 ? 10 : 12, 1.0f);
    if (r == 0) {
      EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kRemoteError, "allreduce #0",
                         "rank 1 called allreduce float32[12] sum where this rank called "
                         "allreduce float32[10] sum");
    } else {
      EXPECT_TUTTI_ERROR(groups[1]->allreduce(v), ErrorCode::kRemoteError,
                         "rank 0 called allreduce float32[10] sum");
    }
    EXPECT_TUTTI_ERROR(groups[r]->barrier(), ErrorCode::kAborted, "aborted");
  });
}

// Ops on either side of the small-message path's 16 KiB (a small op waits on the peers' slots,
// a large one in the barrier) or a large broadcast one rank skipped: each rank waits on another
// word, so neither wait ends by itself; one sees the other's tag for the same op after a nap and
// fails at once with kRemoteError naming both ops (the other, whose group it aborts, quotes it),
// not at the 20 s timeout.
TEST(ShmThreads, OpsOfDifferentSizeClassesFailAtOnceNamingThePeer) {
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    auto groups = create_groups(2, "shm", unique_name("shm-size-class"), milliseconds(20000));
    run_ranks(2, [&](int r) {
      const auto start = std::chrono::steady_clock::now();
      if (variant == 0) {
        std::vector<float> v(r == 0 ? 4096 : 4097, 1.0f);  // 16384 B (small) and 16388 B
        // Whichever rank sees it first aborts the group; the other's message quotes it.
        EXPECT_TUTTI_ERROR(groups[r]->allreduce(v), ErrorCode::kRemoteError, "allreduce #0",
                           "allreduce float32[4097] sum", "allreduce float32[4096] sum");
      } else if (r == 0) {
        std::vector<float> big(1 << 18, 1.0f);  // rank 1 skips it
        EXPECT_TUTTI_ERROR(groups[0]->broadcast(big), ErrorCode::kRemoteError, "broadcast #0",
                           "allreduce float32[4] sum", "broadcast float32[262144]");
      } else {
        std::vector<float> small(4, 1.0f);
        EXPECT_TUTTI_ERROR(groups[1]->allreduce(small), ErrorCode::kRemoteError, "allreduce #0",
                           "allreduce float32[4] sum", "broadcast float32[262144]");
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    });
  }
}

TEST(ShmThreads, SendToASizeMismatchFails) {
  auto groups = create_groups(2, "shm", unique_name("shm-p2p"), milliseconds(5000));
  run_ranks(2, [&](int r) {
    if (r == 0) {
      std::vector<int64_t> v(7, 1);
      groups[0]->send(v, 1);
    } else {
      std::vector<int64_t> v(9);
      EXPECT_TUTTI_ERROR(groups[1]->recv(v, 0), ErrorCode::kRemoteError,
                         "rank 0 sent int64[7] (message #0)", "receives int64[9]");
    }
  });
}

// Only the byte counts agree: float32[4] sent, int32[4] expected.
TEST(ShmThreads, SendToADtypeMismatchFails) {
  auto groups = create_groups(2, "shm", unique_name("shm-dtype"), milliseconds(5000));
  run_ranks(2, [&](int r) {
    if (r == 0) {
      std::vector<float> v(4, 1.5f);
      groups[0]->send(v, 1);
    } else {
      std::vector<int32_t> v(4, 7);
      EXPECT_TUTTI_ERROR(groups[1]->recv(v, 0), ErrorCode::kRemoteError, "rank 0 sent float32[4]",
                         "receives int32[4]");
      EXPECT_EQ(v, std::vector<int32_t>(4, 7)) << "nothing may be received from a mismatched send";
    }
  });
}

}  // namespace
}  // namespace tutti::testing
