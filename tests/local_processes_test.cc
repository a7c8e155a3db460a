// The table of processes that run tutti groups on this kernel (src/util/local_processes.h): what
// the shm backend counts to tell whether its ranks have a core each.
#include "util/local_processes.h"
#include "util/host_identity.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace tutti::detail {
namespace {

cpu_set_t all_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  return set;
}

// Children that register and then wait for a byte on a pipe before they exit.
struct Children {
  std::vector<pid_t> pids;
  int release[2] = {-1, -1};
  explicit Children(int n, int cpu = -1, int registrations = 1) {
    EXPECT_EQ(::pipe(release), 0);
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        if (cpu >= 0) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(cpu, &one);
          ::sched_setaffinity(0, sizeof(one), &one);
        }
        for (int k = 0; k < registrations; ++k) register_local_process();
        char byte = 1;
        if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
        if (::read(release[0], &byte, 1) < 0) ::_exit(3);
        ::_exit(0);
      }
      pids.push_back(pid);
    }
    for (int i = 0; i < n; ++i) {
      char byte;
      EXPECT_EQ(::read(ready[0], &byte, 1), 1);
    }
    ::close(ready[0]);
    ::close(ready[1]);
  }
  void end() {
    for (size_t i = 0; i < pids.size(); ++i) {
      char byte = 1;
      EXPECT_EQ(::write(release[1], &byte, 1), 1);
    }
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    pids.clear();
  }
  ~Children() {
    if (!pids.empty()) end();
    ::close(release[0]);
    ::close(release[1]);
  }
};

bool listed(const std::vector<long>& pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), static_cast<long>(pid)) != pids.end();
}

// Other processes of the machine may be registered too: the tests look for their children's pids.
TEST(LocalProcesses, ListsLiveRegisteredProcessesOnlyWhileTheyLive) {
  register_local_process();
  Children kids(3);
  const std::vector<long> during = local_processes(all_cpus());
  for (pid_t p : kids.pids) EXPECT_TRUE(listed(during, p)) << p;
  EXPECT_FALSE(listed(during, ::getpid()));  // never itself
  EXPECT_GE(count_local_processes(all_cpus()), 1 + 3);
  const std::vector<pid_t> gone = kids.pids;
  kids.end();
  // Their slots stay behind, but their processes are gone: not listed (and freed).
  const std::vector<long> after = local_processes(all_cpus());
  for (pid_t p : gone) EXPECT_FALSE(listed(after, p)) << p;
}

TEST(LocalProcesses, AProcessBoundElsewhereDoesNotCount) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  if (cpus < 2) GTEST_SKIP() << "needs two CPUs (this machine has " << cpus << ")";
  cpu_set_t first, second;
  CPU_ZERO(&first);
  CPU_SET(0, &first);
  CPU_ZERO(&second);
  CPU_SET(1, &second);
  Children kids(2, /*cpu=*/1);
  const std::vector<long> on_first = local_processes(first);
  const std::vector<long> on_second = local_processes(second);
  for (pid_t p : kids.pids) {
    EXPECT_TRUE(listed(on_second, p)) << p;
    EXPECT_FALSE(listed(on_first, p)) << p;  // bound to CPU 1, it takes nothing from CPU 0
  }
}

// A process that holds a group and runs no op (a notebook's kernel) takes no CPU: not counted
// once it has been idle for kIdleAfter, counted again from its next op.
TEST(LocalProcesses, AnIdleProcessIsNotCountedUntilItRunsAnOpAgain) {
  int go[2], said[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(said), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    register_local_process();
    // Its last op, as far as the table knows, long ago (written whatever the throttle says).
    note_local_activity_now(std::chrono::steady_clock::now() - kIdleAfter -
                            std::chrono::seconds(1));
    char byte = 1;
    if (::write(said[1], &byte, 1) != 1) ::_exit(2);
    if (::read(go[0], &byte, 1) != 1) ::_exit(3);
    note_local_activity_now(std::chrono::steady_clock::now());  // an op now
    if (::write(said[1], &byte, 1) != 1) ::_exit(4);
    if (::read(go[0], &byte, 1) < 0) ::_exit(5);
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(said[0], &byte, 1), 1);
  EXPECT_FALSE(listed(local_processes(all_cpus()), pid)) << "idle since its registration";
  ASSERT_EQ(::write(go[1], &byte, 1), 1);
  ASSERT_EQ(::read(said[0], &byte, 1), 1);
  EXPECT_TRUE(listed(local_processes(all_cpus()), pid)) << "it ran an op";
  ASSERT_EQ(::write(go[1], &byte, 1), 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {go[0], go[1], said[0], said[1]}) ::close(fd);
}

// A process making another group runs no op while it does (its rendezvous): it counts again from
// that registration, whatever its last op was.
TEST(LocalProcesses, MakingAnotherGroupCountsAsActivity) {
  int said[2];
  ASSERT_EQ(::pipe(said), 0);
  int hold[2];
  ASSERT_EQ(::pipe(hold), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    register_local_process();
    note_local_activity_now(std::chrono::steady_clock::now() - kIdleAfter -
                            std::chrono::seconds(1));
    register_local_process();  // another group
    char byte = 1;
    if (::write(said[1], &byte, 1) != 1) ::_exit(2);
    if (::read(hold[0], &byte, 1) < 0) ::_exit(3);
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(said[0], &byte, 1), 1);
  EXPECT_TRUE(listed(local_processes(all_cpus()), pid));
  ASSERT_EQ(::write(hold[1], &byte, 1), 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {said[0], said[1], hold[0], hold[1]}) ::close(fd);
}

TEST(LocalProcesses, RegisteringTwiceTakesOneSlot) {
  Children kid(1, -1, /*registrations=*/3);
  const std::vector<long> pids = local_processes(all_cpus());
  EXPECT_EQ(std::count(pids.begin(), pids.end(), static_cast<long>(kid.pids[0])), 1);
}

}  // namespace
}  // namespace tutti::detail

namespace tutti::detail {
namespace {

// A process's start time (what tells a live rank from a recycled pid): this process's is known,
// an exited child's (zombie, then reaped) is 0, and asking while processes exit under the
// question never throws (it read /proc/<pid>/stat through a stream, whose read error ESRCH from a
// process exiting between the open and the read escaped as std::terminate).
TEST(ProcessStartTime, LiveZombieAndGoneProcesses) {
  EXPECT_GT(process_start_time(::getpid()), 0u);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  // Until it has exited (a zombie, not yet reaped): then 0.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (process_start_time(child) != 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(process_start_time(child), 0u);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(process_start_time(child), 0u);  // gone
  for (int i = 0; i < 200; ++i) {
    const pid_t quick = ::fork();
    if (quick == 0) ::_exit(0);
    (void)process_start_time(quick);  // it may be exiting right now: never throws
    ::waitpid(quick, &status, 0);
  }
}

}  // namespace
}  // namespace tutti::detail
