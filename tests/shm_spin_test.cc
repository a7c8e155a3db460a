// The shm backend's adaptive spin budget (backends/shm/shm_wait.h): how each kind of wait moves
// it, and how await() cuts its polls short. Pure bookkeeping, no timing.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <thread>

#include "../backends/shm/shm_cpus.h"
#include "../backends/shm/shm_layout.h"
#include "../backends/shm/shm_slice.h"
#include "../backends/shm/shm_wait.h"
#include "slice_skip.h"

namespace tutti::shm_backend {
namespace {

using std::chrono::microseconds;

WaitOutcome spun() {
  return WaitOutcome{};
}
WaitOutcome slept(microseconds how_long) {
  return WaitOutcome{true, how_long};
}

TEST(AdaptiveSpin, ShortSleepsDoubleTheBudgetUpToTheCap) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 16);
  a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 4000);
  EXPECT_EQ(a.policy().yields, 100);
  for (int i = 0; i < 10; ++i) a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 32000);
  EXPECT_EQ(a.policy().yields, 800);
}

TEST(AdaptiveSpin, LongSleepsHalveItAndSpunWaitsDecayItToTheBase) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 16);
  for (int i = 0; i < 4; ++i) a.record(slept(microseconds(70)));
  ASSERT_EQ(a.policy().spins, 32000);
  a.record(slept(microseconds(5000)));
  EXPECT_EQ(a.policy().spins, 16000);
  a.record(spun());
  EXPECT_LT(a.policy().spins, 16000);
  EXPECT_GT(a.policy().spins, 14000);  // a slow decay, not a reset
  for (int i = 0; i < 1000; ++i) a.record(spun());
  EXPECT_EQ(a.policy().spins, 2000);
  EXPECT_EQ(a.policy().yields, 50);
}

TEST(AdaptiveSpin, TheScaledPolicyKeepsEveryOtherFieldOfTheBase) {
  SpinPolicy base{2000, 50, microseconds(300), std::chrono::milliseconds(7), microseconds(90), 5};
  AdaptiveSpin a(base, 16);
  a.record(slept(microseconds(70)));
  const SpinPolicy p = a.policy();
  EXPECT_EQ(p.spins, 4000);
  EXPECT_EQ(p.spin_for, microseconds(600));
  EXPECT_EQ(p.contended_for, std::chrono::milliseconds(7));
  EXPECT_EQ(p.off_cpu_gap, microseconds(90));
  EXPECT_EQ(p.paced, 5);  // the paced polls are not scaled
}

TEST(OffCpu, ASwitchCountsOnlyWhereTheThreadWasOffItsCpuForMoreThanAHundredthOr200Us) {
  // A 36 ms op, switched out once for 50 us (a kernel thread): its time stands.
  EXPECT_FALSE(off_cpu_counts(36000000, 35950000, 1));
  // Switched out for 4 ms of it (another process's slice): left out.
  EXPECT_TRUE(off_cpu_counts(36000000, 32000000, 1));
  // 300 us in a 36 ms op (under 1%, over 200 us: a short slice): left out.
  EXPECT_TRUE(off_cpu_counts(36000000, 35700000, 1));
  // Exactly 1% off (and under 200 us): stands; just over: left out.
  EXPECT_FALSE(off_cpu_counts(1000000, 990000, 2));
  EXPECT_TRUE(off_cpu_counts(1000000, 989000, 2));
  // No involuntary switch: whatever the CPU time says (asleep in a wait is no preemption).
  EXPECT_FALSE(off_cpu_counts(36000000, 1000000, 0));
  // No CPU time to compare: every switch counts, as before.
  EXPECT_TRUE(off_cpu_counts(36000000, 0, 1));
}

TEST(OffCpu, ThisThreadsCpuTimeAdvancesWhileItComputes) {
  const int64_t before = thread_cpu_ns();
  ASSERT_GT(before, 0);
  volatile uint64_t x = 0;
  for (int i = 0; i < 5000000; ++i) x = x + static_cast<uint64_t>(i);
  EXPECT_GT(thread_cpu_ns(), before);
}

TEST(AdaptiveSpin, AScaleOfOneKeepsItFixed) {
  AdaptiveSpin a(SpinPolicy{2000, 50}, 1);
  a.record(slept(microseconds(70)));
  a.record(slept(microseconds(70)));
  EXPECT_EQ(a.policy().spins, 2000);
  EXPECT_EQ(a.policy().yields, 50);
}

// await() polls its condition up to the budget's spins while keep_spinning() agrees (asked every
// 256 polls), then yields, then sleeps. Counted in calls of the condition.
TEST(Await, PollsTheWholeBudgetWhileAskedToKeepSpinning) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  int polls = 0, asked = 0;
  WaitOutcome outcome;
  const bool ok = await([&] { return ++polls == 100000; }, word, sleepers,
                        Clock::now() + std::chrono::seconds(10), SpinPolicy{200000, 5},
                        [&] { return ++asked, true; }, [] {}, &outcome);
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 100000);
  EXPECT_EQ(asked, 100000 / 256);
  EXPECT_FALSE(outcome.slept);
}

TEST(Await, StopsPollingAtTheFirstNoThenYieldsAndSleeps) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  int polls = 0, asked = 0;
  WaitOutcome outcome;
  // 256 polls, the no, 5 yields' polls, then the sleep phase's first look finds it ready.
  const bool ok = await([&] { return ++polls == 256 + 5 + 1; }, word, sleepers,
                        Clock::now() + std::chrono::seconds(10), SpinPolicy{200000, 5},
                        [&] { return ++asked, false; }, [] {}, &outcome);
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 256 + 5 + 1);
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(outcome.slept);  // it reached the sleep phase: the 200000 polls were cut short
}

// kSleepNow: the polls stop and the yields are left out too; the wait goes straight to sleep.
TEST(Await, ASleepNowLeavesTheYieldsOut) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  int polls = 0, asked = 0;
  WaitOutcome outcome;
  // 256 polls, the answer, then the sleep phase's first look finds it ready (no yield's poll).
  const bool ok = await([&] { return ++polls == 256 + 1; }, word, sleepers,
                        Clock::now() + std::chrono::seconds(10), SpinPolicy{200000, 5},
                        [&] { return ++asked, kSleepNow; }, [] {}, &outcome);
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 256 + 1);
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(outcome.slept);
}

// With a time budget the polls go on until it has passed (however many that takes), but never
// past the wait's deadline.
TEST(Await, PollsForItsTimeThenSleepsButNeverPastTheDeadline) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  WaitOutcome outcome;
  const auto start = Clock::now();
  const bool ok =
      await([&] { return Clock::now() - start >= std::chrono::milliseconds(3); }, word, sleepers,
            Clock::now() + std::chrono::seconds(10), SpinPolicy{10, 0, std::chrono::seconds(5)},
            [] { return true; }, [] {}, &outcome);
  EXPECT_TRUE(ok);
  EXPECT_FALSE(outcome.slept);  // 3 ms of polling fit in the 5 s budget

  const auto begin = Clock::now();
  const bool late =
      await([] { return false; }, word, sleepers, Clock::now() + std::chrono::milliseconds(2),
            SpinPolicy{10, 0, std::chrono::seconds(5)}, [] { return true; }, [] {});
  const auto took = Clock::now() - begin;
  EXPECT_FALSE(late);
  EXPECT_LT(took, std::chrono::milliseconds(500));  // the 2 ms deadline, not the 5 s budget
  EXPECT_GE(took, std::chrono::milliseconds(2));
}

// Past its time budget a wait polls on, one budget after another, while it was off its CPU
// during the last (a gap between two clock reads longer than off_cpu_gap: another process wants
// its CPU, and asleep it would wait out that process's slice) and poll_on() agrees, looking at
// its peers between budgets (on_nap, as after a sleep); up to contended_for in all, then it
// sleeps as before. An off_cpu_gap of 0 counts every budget as spent off the CPU, a day none;
// the conditions count the looks, not the clock, so that a test descheduled for real still sees
// the same steps.
SpinPolicy two_ms_budgets(Clock::duration contended_for, Clock::duration off_cpu_gap) {
  SpinPolicy policy{10, 0, std::chrono::milliseconds(2)};
  policy.contended_for = contended_for;
  policy.off_cpu_gap = off_cpu_gap;
  return policy;
}
constexpr Clock::duration kAlwaysOff{0};
constexpr Clock::duration kNeverOff = std::chrono::hours(24);
constexpr auto kYes = [] { return true; };

TEST(Await, PollsOnPastItsBudgetWhileOffItsCpu) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  WaitOutcome outcome;
  int looks = 0;
  const bool ok = await(
      [&] { return looks >= 3; }, word, sleepers, Clock::now() + std::chrono::seconds(20),
      two_ms_budgets(std::chrono::seconds(10), kAlwaysOff), kYes, [&] { ++looks; }, &outcome, kYes);
  EXPECT_TRUE(ok);
  EXPECT_FALSE(outcome.slept);  // three budgets' ends, each followed by another budget
  EXPECT_EQ(looks, 3);
}

TEST(Await, SleepsAfterItsBudgetWhereItKeptItsCpuOrPollOnSaysNo) {
  for (const bool off : {false, true}) {
    std::atomic<uint32_t> word{0}, sleepers{0};
    WaitOutcome outcome;
    int looks = 0, asked = 0;
    const bool ok =
        await([&] { return looks >= 1; }, word, sleepers, Clock::now() + std::chrono::seconds(20),
              two_ms_budgets(std::chrono::seconds(10), off ? kAlwaysOff : kNeverOff), kYes,
              [&] { ++looks; }, &outcome, [&] { return ++asked, false; });
    EXPECT_TRUE(ok);
    EXPECT_TRUE(outcome.slept) << off;  // the one look was after a sleep
    EXPECT_EQ(asked, off ? 1 : 0);      // asked only where it was off its CPU
  }
}

// What a wait past its budget asks of each peer it waits for before it polls on: in a
// collective, that the peer has begun it (its begun at or past the op's number, across the
// counter's wrap); in a point-to-point wait, that the peer runs a batch and is not asleep in it.
TEST(ComesOnceItRuns, ACollectivesPeerOnceItHasBegunTheOp) {
  RankSlot slot;
  Bell bell;
  slot.begun.store(6);
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 7));  // still before it
  EXPECT_TRUE(comes_once_it_runs(slot, bell, 6));
  EXPECT_TRUE(comes_once_it_runs(slot, bell, 5));  // already past it (the op ended for it)
  slot.begun.store(0xffffffffu);
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 1));  // op 1 after the wrap: not begun yet
  slot.begun.store(2);
  EXPECT_TRUE(comes_once_it_runs(slot, bell, 0xfffffffeu));
  // A peer inside a batch of point-to-point ops says nothing of a collective.
  slot.begun.store(3);
  bell.in_p2p.value.store(1);
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 4));
}

// A wait reads no beat before its 4th look here, then says "may sleep" at the look that makes 5
// in a row at which every rank it waits for sat still (odd, unchanged), and starts counting again.
TEST(StillWatch, SaysMaySleepAfterItsLooksInARowOfStillRanks) {
  StillWatch w(/*beat_from=*/4, /*still_looks=*/5);
  uint32_t seen_a = 0, seen_b = 0;
  // One look: the beats of the two ranks waited for; whether the look read them, and its answer.
  auto look = [&](uint32_t a, uint32_t b, bool* read = nullptr) {
    w.begin_look();
    bool any = false;
    if (w.watching()) {
      w.peer(a, seen_a);
      any = true;
    }
    if (w.watching()) w.peer(b, seen_b);
    if (read != nullptr) *read = any;
    return w.end_look();
  };
  bool read = true;
  for (int i = 1; i <= 3; ++i) {  // looks 1-3: no beat read, never a yes
    EXPECT_FALSE(look(7, 9, &read)) << i;
    EXPECT_FALSE(read) << i;
  }
  EXPECT_EQ(seen_a, 0u);
  EXPECT_FALSE(look(7, 9, &read));  // look 4: first sight of a's beat (0 before): no row yet,
  EXPECT_TRUE(read);                // and b not read (a looked like moving)
  EXPECT_EQ(seen_b, 0u);
  EXPECT_FALSE(look(7, 9));                                    // look 5: first sight of b's
  for (int i = 1; i <= 4; ++i) EXPECT_FALSE(look(7, 9)) << i;  // a row of 4
  EXPECT_TRUE(look(7, 9));                                     // 5: may sleep
  for (int i = 1; i <= 4; ++i) EXPECT_FALSE(look(7, 9)) << i;  // counted again from 0
  EXPECT_FALSE(look(7, 11));  // b polled meanwhile (it runs): the row breaks
  for (int i = 1; i <= 4; ++i) EXPECT_FALSE(look(7, 11)) << i;
  EXPECT_FALSE(look(8, 11));  // a left its wait (even): it runs, or computes
  EXPECT_FALSE(look(8, 11));  // even and unchanged is not "still in a wait"
  // A look stops reading at the first rank seen moving: b keeps the beat seen before.
  EXPECT_FALSE(look(10, 13));
  EXPECT_EQ(seen_b, 11u);
  // No rank to wait for never counts.
  StillWatch none(1, 1);
  for (int i = 0; i < 3; ++i) {
    none.begin_look();
    EXPECT_FALSE(none.end_look());
  }
  // still_looks 0 (TUTTI_SHM_STILL_LOOKS=0): beats are published, none is read, never a yes.
  StillWatch off(1, 0);
  uint32_t seen = 7;
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(off.begin_look());
    EXPECT_FALSE(off.watching());
    if (off.watching()) off.peer(7, seen);
    EXPECT_FALSE(off.end_look());
  }
}

// A staging half fits W slices of one 8-byte element (reduce's and reduce_scatter's), whatever
// TUTTI_SHM_CHUNK_BYTES asks; otherwise the asked size in whole pages.
TEST(StagingChunk, HoldsAnEightByteElementPerRankInWholePages) {
  EXPECT_EQ(staging_chunk(size_t{1} << 20, 2, 4096), size_t{1} << 20);
  EXPECT_EQ(staging_chunk(5000, 2, 4096), 8192u);
  EXPECT_EQ(staging_chunk(4096, 512, 4096), 4096u);      // 512 x 8 bytes: one page
  EXPECT_EQ(staging_chunk(4096, 513, 4096), 8192u);      // 4104 bytes: two pages
  EXPECT_EQ(staging_chunk(4096, 600, 65536), 65536u);    // 64 KiB pages
  EXPECT_EQ(staging_chunk(4096, 20000, 4096), 163840u);  // 160000 bytes: 40 pages
}

TEST(SeqAtOrAfter, HoldsAcrossTheWrap) {
  EXPECT_TRUE(seq_at_or_after(5, 5));
  EXPECT_TRUE(seq_at_or_after(6, 5));
  EXPECT_FALSE(seq_at_or_after(4, 5));
  EXPECT_TRUE(seq_at_or_after(2, 0xfffffff0u));  // 18 ops later, past the wrap
  EXPECT_FALSE(seq_at_or_after(0xfffffff0u, 2));
  EXPECT_TRUE(seq_at_or_after(0x80000000u, 1));  // 2^31 - 1 apart: the farthest it tells
}

TEST(ComesOnceItRuns, APointToPointPeerInsideABatchAndAwake) {
  RankSlot slot;
  Bell bell;
  slot.begun.store(9);  // its collectives say nothing of a point-to-point wait
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 0));
  bell.in_p2p.value.store(1);
  EXPECT_TRUE(comes_once_it_runs(slot, bell, 0));
  bell.sleepers.value.store(1);  // asleep in its batch: it waits for a ring, not for a CPU
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 0));
  bell.in_p2p.value.store(0);
  bell.sleepers.value.store(0);
  EXPECT_FALSE(comes_once_it_runs(slot, bell, 0));
}

TEST(Await, TheContendedPollsEndAtTheirTotalAndAtTheDeadline) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  WaitOutcome outcome;
  int looks = 0, polling_looks = 0, polls = 0;
  // 6 ms of polling hold at most three budgets' ends; the other looks follow naps (a look after
  // polling comes after thousands of polls, one after a nap after a few).
  const bool ok = await([&] { return ++polls, looks >= 10; }, word, sleepers,
                        Clock::now() + std::chrono::seconds(20),
                        two_ms_budgets(std::chrono::milliseconds(6), kAlwaysOff), kYes,
                        [&] {
                          if (polls > 100) ++polling_looks;
                          polls = 0;
                          ++looks;
                        },
                        &outcome, kYes);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(outcome.slept);
  EXPECT_LE(polling_looks, 3);

  const auto begin = Clock::now();
  const bool late =
      await([] { return false; }, word, sleepers, Clock::now() + std::chrono::milliseconds(10),
            two_ms_budgets(std::chrono::seconds(5), kAlwaysOff), kYes, [] {}, nullptr, kYes);
  EXPECT_FALSE(late);
  EXPECT_LT(Clock::now() - begin, std::chrono::milliseconds(2000));  // the deadline, not 5 s
}

// A look between budgets that throws (a dead peer) ends the wait with it, counted asleep nowhere.
TEST(Await, ALookBetweenBudgetsThatThrowsEndsTheWait) {
  std::atomic<uint32_t> word{0}, sleepers{0};
  WaitOutcome outcome;
  EXPECT_THROW(await([] { return false; }, word, sleepers, Clock::now() + std::chrono::seconds(20),
                     two_ms_budgets(std::chrono::seconds(10), kAlwaysOff), kYes,
                     [] { throw std::runtime_error("rank 1 died"); }, &outcome, kYes),
               std::runtime_error);
  EXPECT_EQ(sleepers.load(), 0u);
  EXPECT_FALSE(outcome.slept);
}

// Whether the ranks have a core each: the union of their affinity masks (hex, CPU 4k + b in bit
// b of digit k), capped by a cgroup's cpu.max.
TEST(UsableCpus, TheUnionOfTheRanksMasksCappedByTheCgroup) {
  EXPECT_EQ(cpus_in_union({"1", "2"}), 2);       // bound to CPUs 0 and 1: a core each
  EXPECT_EQ(cpus_in_union({"1", "1"}), 1);       // both bound to CPU 0
  EXPECT_EQ(cpus_in_union({"0f", "f"}), 8);      // CPUs 4-7 and 0-3
  EXPECT_EQ(cpus_in_union({"3", "6", "c"}), 4);  // {0,1} | {1,2} | {2,3}
  EXPECT_EQ(cpus_in_union({}), 0);
  EXPECT_EQ(cpu_max_cpus("max 100000"), 0.0);
  EXPECT_EQ(cpu_max_cpus("150000 100000"), 1.5);
  EXPECT_EQ(cpu_max_cpus("400000 100000\n"), 4.0);
  EXPECT_EQ(cpu_max_cpus(""), 0.0);
  EXPECT_EQ(cpu_max_cpus("garbage"), 0.0);
  EXPECT_EQ(usable_cpus(2, 0, 64), 2);     // two bound ranks on a 64-CPU host
  EXPECT_EQ(usable_cpus(64, 1.5, 64), 1);  // a container allowed one and a half CPUs
  EXPECT_EQ(usable_cpus(8, 0.5, 8), 1);
  EXPECT_EQ(usable_cpus(0, 0, 8), 8);  // no mask readable: the machine's count
  EXPECT_EQ(usable_cpus(0, 2, 8), 2);
}

// A thread's first look at its lost CPU only notes the count: it never says "contended", however
// often the thread was switched out before (here: a thread that has not looked yet).
TEST(ThreadLostCpuLately, AThreadsFirstLookSaysNo) {
  bool first = true;
  std::thread([&] { first = thread_lost_cpu_lately(std::chrono::seconds(100)); }).join();
  EXPECT_FALSE(first);
}

// This process's mask, as written for the other ranks, holds exactly the CPUs the kernel says.
TEST(UsableCpus, ThisProcesssMaskRoundTrips) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  const std::string text = affinity_mask_text();
  EXPECT_EQ(cpus_in_union({text}), CPU_COUNT(&set)) << text;
  for (int cpu = 0; cpu < 4 * static_cast<int>(text.size()); ++cpu) {
    const int digit = std::stoi(text.substr(cpu / 4, 1), nullptr, 16);
    EXPECT_EQ((digit >> (cpu % 4)) & 1, CPU_ISSET(cpu, &set) ? 1 : 0) << "CPU " << cpu;
  }
}

// A thread's scheduling attributes are its own: each case runs in a thread of its own.
TEST(ShortSlices, AFairThreadGetsTheSliceItAsksForAndKeepsItsNice) {
  if (const std::string why = testing::why_slices_cannot_be_tested(200'000); !why.empty()) {
    GTEST_SKIP() << why;
  }
  const uint64_t main_before = current_slice_ns();
  uint64_t before = 0, after = 0;
  int nice_after = 0;
  SliceAnswer first{}, again{}, below_the_floor{};
  std::thread([&] {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    ASSERT_EQ(::setpriority(PRIO_PROCESS, tid, 3), 0);
    before = current_slice_ns();
    first = ask_for_short_slices(200'000);
    after = current_slice_ns();
    errno = 0;
    nice_after = ::getpriority(PRIO_PROCESS, tid);
    again = ask_for_short_slices(200'000);
    below_the_floor = ask_for_short_slices(1);  // the kernel's floor is 100 us
  }).join();
  ASSERT_GT(before, 200'000u) << "the default slice";
  EXPECT_EQ(first, SliceAnswer::kShortened) << describe(first);
  EXPECT_EQ(after, 200'000u);
  EXPECT_EQ(nice_after, 3);
  EXPECT_EQ(again, SliceAnswer::kShortAlready) << describe(again);
  EXPECT_EQ(below_the_floor, SliceAnswer::kShortened) << describe(below_the_floor);
  EXPECT_EQ(current_slice_ns(), main_before) << "another thread's slice changed";
}

TEST(ShortSlices, AnIdleOrRealTimeThreadIsLeftAlone) {
  if (const std::string why = testing::why_slices_cannot_be_tested(200'000); !why.empty()) {
    GTEST_SKIP() << why;
  }
  SliceAnswer answer{};
  int policy = -1;
  std::thread([&] {
    sched_param p{};
    ASSERT_EQ(::sched_setscheduler(0, SCHED_IDLE, &p), 0);
    answer = ask_for_short_slices(100'000);
    policy = ::sched_getscheduler(0);
  }).join();
  EXPECT_EQ(answer, SliceAnswer::kNotFair) << describe(answer);
  EXPECT_EQ(policy, SCHED_IDLE);
}

}  // namespace
}  // namespace tutti::shm_backend
