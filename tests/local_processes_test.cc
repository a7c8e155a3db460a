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
#include <functional>
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

// A child that runs its steps one at a time: step(k) runs in the child when the parent calls
// next(), which returns once it has run; the child lives on after the last until the parent is
// done with it (the destructor). Before, it exited right after its last step, and a parent that
// looked at the table after that step found it gone (7 runs in 100 under ASan).
class SteppedChild {
 public:
  explicit SteppedChild(std::vector<std::function<void()>> steps) {
    EXPECT_EQ(::pipe(go_), 0);
    EXPECT_EQ(::pipe(done_), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(go_[1]);  // so that the parent's close ends a wait for a step
      ::close(done_[0]);
      char byte = 1;
      for (auto& step : steps) {
        if (::read(go_[0], &byte, 1) != 1) ::_exit(2);
        step();
        if (::write(done_[1], &byte, 1) != 1) ::_exit(3);
      }
      while (::read(go_[0], &byte, 1) == 1) {
      }  // until the parent closes its end
      ::_exit(0);
    }
    ::close(go_[0]);
    ::close(done_[1]);
    go_[0] = done_[1] = -1;
  }
  void next() {
    char byte = 1;
    ASSERT_EQ(::write(go_[1], &byte, 1), 1);
    ASSERT_EQ(::read(done_[0], &byte, 1), 1);
  }
  ~SteppedChild() {
    ::close(go_[1]);  // ends a child still waiting for a step
    ::close(done_[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status)) << status;
  }
  SteppedChild(const SteppedChild&) = delete;
  SteppedChild& operator=(const SteppedChild&) = delete;
  pid_t pid = -1;

 private:
  int go_[2] = {-1, -1};
  int done_[2] = {-1, -1};
};

// Its last op, as far as the table knows, long ago (written whatever the throttle says).
void note_an_old_op() {
  note_local_activity_now(std::chrono::steady_clock::now() - kIdleAfter - std::chrono::seconds(1));
}

// A process that holds a group and runs no op (a notebook's kernel) takes no CPU: not counted
// once it has been idle for kIdleAfter, counted again from its next op.
TEST(LocalProcesses, AnIdleProcessIsNotCountedUntilItRunsAnOpAgain) {
  SteppedChild child({[] {
                        register_local_process();
                        note_an_old_op();
                      },
                      [] { note_local_activity_now(std::chrono::steady_clock::now()); }});
  child.next();
  EXPECT_FALSE(listed(local_processes(all_cpus()), child.pid)) << "idle since its registration";
  child.next();
  EXPECT_TRUE(listed(local_processes(all_cpus()), child.pid)) << "it ran an op";
}

// A process making another group runs no op while it does (its rendezvous): it counts again from
// that registration, whatever its last op was.
TEST(LocalProcesses, MakingAnotherGroupCountsAsActivity) {
  SteppedChild child({[] {
                        register_local_process();
                        note_an_old_op();
                      },
                      [] { register_local_process(); }});  // another group
  child.next();
  EXPECT_FALSE(listed(local_processes(all_cpus()), child.pid));
  child.next();
  EXPECT_TRUE(listed(local_processes(all_cpus()), child.pid));
}

// The pipes between the test and a child paused inside its registration.
int claim_paused[2] = {-1, -1};
int claim_resume[2] = {-1, -1};
void pause_in_claim() {
  char byte = 1;
  if (::write(claim_paused[1], &byte, 1) != 1) ::_exit(4);
  if (::read(claim_resume[0], &byte, 1) != 1) ::_exit(5);
}

// A count taken while another process fills in the slot it claims sees it as a process (being
// claimed), and neither skips it nor frees the slot from under it; before, the slot kept the
// gone owner's start until the claimer cleared it, and a count then freed it. The slots a test
// machine's table holds were mostly used before, so several claims are tried.
TEST(LocalProcesses, ACountDuringARegistrationLeavesTheSlotToTheClaimer) {
  for (int round = 0; round < 8; ++round) {
    ASSERT_EQ(::pipe(claim_paused), 0);
    ASSERT_EQ(::pipe(claim_resume), 0);
    {
      SteppedChild gone({[] { register_local_process(); }});
      gone.next();  // a slot used by a process that exits (here), for the next claim to find
    }
    const pid_t child = ::fork();
    if (child == 0) {
      local_process_claim_pause = pause_in_claim;
      register_local_process();
      pause_in_claim();  // registered: until the test has counted again
      ::_exit(0);
    }
    char byte = 1;
    ASSERT_EQ(::read(claim_paused[0], &byte, 1), 1);
    EXPECT_TRUE(listed(local_processes(all_cpus()), child)) << "being claimed, round " << round;
    ASSERT_EQ(::write(claim_resume[1], &byte, 1), 1);  // it fills the slot in
    ASSERT_EQ(::read(claim_paused[0], &byte, 1), 1);
    // Listed: its slot is still its own.
    EXPECT_TRUE(listed(local_processes(all_cpus()), child)) << "registered, round " << round;
    ASSERT_EQ(::write(claim_resume[1], &byte, 1), 1);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    for (int* fd : {claim_paused, claim_resume}) {
      ::close(fd[0]);
      ::close(fd[1]);
    }
  }
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
