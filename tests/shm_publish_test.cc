// How the shm backend's staged collectives choose their stores (backends/shm/shm_publish.h),
// with times made up here, and the streaming copy they use (util/stream_copy.h); and the
// segment's layout check (backends/shm/shm_segment.h), which needs no peer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../backends/shm/shm_publish.h"
#include "../backends/shm/shm_segment.h"
#include "tutti/error.h"
#include "tutti/hash_store.h"
#include "util/stream_copy.h"

namespace tutti::shm_backend {
namespace {

using std::chrono::microseconds;
using Chooser = PublishChooser;
constexpr size_t kMiB = size_t{1} << 20;

// Runs one op of `bytes` on c, taking `cached` or `streamed` as the pick says; returns the pick.
Chooser::Pick run(Chooser& c, size_t bytes, microseconds cached, microseconds streamed,
                  Chooser::Kind kind = Chooser::kReduce) {
  const Chooser::Pick p = c.pick(kind, bytes);
  c.record(p, p.stream ? streamed : cached);
  return p;
}

TEST(PublishChooser, SmallMessagesAndFixedModesAreNotMeasured) {
  Chooser c;
  EXPECT_EQ(c.pick(Chooser::kReduce, Chooser::kMinBytes - 1).cell, -1);
  EXPECT_FALSE(c.pick(Chooser::kReduce, Chooser::kMinBytes - 1).stream);
  EXPECT_FALSE(c.pick(Chooser::kReduce, Chooser::kMinBytes - 1).timed);
  EXPECT_GE(c.pick(Chooser::kReduce, Chooser::kMinBytes).cell, 0);
  Chooser streamed(Chooser::Mode::kStreamed);
  EXPECT_TRUE(streamed.pick(Chooser::kReduce, 64 * kMiB).stream);
  EXPECT_FALSE(streamed.pick(Chooser::kReduce, 64 * kMiB).timed);
  Chooser cached(Chooser::Mode::kCached);
  EXPECT_FALSE(cached.pick(Chooser::kReduce, 64 * kMiB).stream);
  EXPECT_FALSE(cached.pick(Chooser::kReduce, 64 * kMiB).timed);
}

TEST(PublishChooser, TheFirstFiveOpsGoOrdinaryThriceThenStreamingTwiceAndTheFasterWins) {
  Chooser c;
  std::vector<bool> ways, timed;
  for (int i = 0; i < 5; ++i) {
    const Chooser::Pick p = c.pick(Chooser::kReduce, kMiB);
    ways.push_back(p.stream);
    timed.push_back(p.timed);
    // Ops 0 and 1 (page faults, lines a first touch left in memory) would read 20x and 2x.
    c.record(p, p.stream ? microseconds(i == 4 ? 130 : 120)
                         : microseconds(i == 0   ? 1000
                                        : i == 1 ? 100
                                                 : 50));
  }
  EXPECT_EQ(ways, (std::vector<bool>{false, false, false, true, true}));
  EXPECT_EQ(timed, (std::vector<bool>{false, false, true, true, true}));
  EXPECT_FALSE(c.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).cached_ns, 50e3);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).streamed_ns, 120e3);  // the better of two
  for (int i = 5; i < 7; ++i) {  // up to the first probe's timed ordinary op, op 7
    const Chooser::Pick p = run(c, kMiB, microseconds(50), microseconds(120));
    EXPECT_FALSE(p.stream);
    EXPECT_FALSE(p.timed);  // no clock read on an ordinary op
  }

  // Another size class, another kind: chosen on their own.
  Chooser d;
  for (int i = 0; i < 5; ++i) run(d, 4 * kMiB, microseconds(2000), microseconds(450));
  EXPECT_TRUE(d.seen(Chooser::kReduce, 4 * kMiB).stream);
  // Ops 5-8 are the first probe (ordinary x3, streaming); its times keep streaming stores.
  for (int i = 5; i < 9; ++i) run(d, 4 * kMiB, microseconds(2000), microseconds(450));
  EXPECT_TRUE(d.pick(Chooser::kReduce, 4 * kMiB).stream);
  EXPECT_TRUE(d.pick(Chooser::kReduce, 8 * kMiB - 1).stream);  // the same class
  EXPECT_FALSE(d.pick(Chooser::kReduce, 8 * kMiB).stream);     // the next one, not yet timed
  EXPECT_FALSE(d.pick(Chooser::kAllgather, 4 * kMiB).stream);
  EXPECT_FALSE(d.pick(Chooser::kSend, 4 * kMiB).stream);
  EXPECT_EQ(Chooser::class_floor(8 * kMiB - 1), 4 * kMiB);
  EXPECT_EQ(Chooser::class_floor(Chooser::kMinBytes), Chooser::kMinBytes);

  // Streaming stores 5% faster in the warm-up (timed after the ordinary ones warmed the user's
  // buffers) do not take over; 11% faster do.
  Chooser e;
  for (int i = 0; i < 5; ++i) run(e, 8 * kMiB, microseconds(2000), microseconds(1900));
  EXPECT_FALSE(e.seen(Chooser::kReduce, 8 * kMiB).stream);
  for (int i = 0; i < 5; ++i) run(e, 16 * kMiB, microseconds(2000), microseconds(1780));
  EXPECT_TRUE(e.seen(Chooser::kReduce, 16 * kMiB).stream);
}

TEST(PublishChooser, EveryRankProbesOnTheSameOpsAndTheFasterWayTakesOverOnAll) {
  // Two ranks' choosers see the same ops with times 3% apart (a barrier makes them alike).
  Chooser a, b;
  std::vector<uint64_t> timed;
  std::vector<bool> ways;
  auto both = [&](uint64_t op, microseconds cached, microseconds streamed) {
    const Chooser::Pick pa = run(a, kMiB, cached, streamed);
    const Chooser::Pick pb = run(b, kMiB, cached * 103 / 100, streamed * 103 / 100);
    EXPECT_EQ(pa.op, op);
    EXPECT_EQ(pa.stream, pb.stream) << "op " << op;
    EXPECT_EQ(pa.timed, pb.timed) << "op " << op;
    if (pa.timed) {
      timed.push_back(op);
      ways.push_back(pa.stream);
    }
    return pa;
  };
  for (uint64_t op = 0; op < 5; ++op) both(op, microseconds(50), microseconds(120));
  timed.clear();
  ways.clear();
  // Probes start at ops 8, 16, 32, 64, then every 128th: the op before each times the chosen
  // (ordinary) stores, the probe's one op streaming ones.
  for (uint64_t op = 5; op < 2 * Chooser::kProbeEvery + 2; ++op) {
    const Chooser::Pick p = both(op, microseconds(50), microseconds(120));
    if (!p.timed) EXPECT_FALSE(p.stream) << "op " << op;
  }
  EXPECT_EQ(timed, (std::vector<uint64_t>{7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256}));
  EXPECT_EQ(ways, (std::vector<bool>{false, true, false, true, false, true, false, true, false,
                                     true, false, true}));
  // The cores moved apart: ordinary stores take 500 us from op 258 on. The second probe that
  // finds streaming faster, at op 512, moves both ranks to streaming stores.
  for (uint64_t op = 2 * Chooser::kProbeEvery + 2; op < 4 * Chooser::kProbeEvery + 2; ++op) {
    const Chooser::Pick p = both(op, microseconds(500), microseconds(110));
    if (!p.timed) EXPECT_EQ(p.stream, op > 4 * Chooser::kProbeEvery) << "op " << op;
  }
  EXPECT_TRUE(a.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_TRUE(b.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_DOUBLE_EQ(a.seen(Chooser::kReduce, kMiB).cached_ns, 500e3);
  // Streaming chosen, a probe still takes three ordinary ops (the first two write lines the
  // streaming stores left in memory), timed at the third, then one streaming op: 637-640.
  timed.clear();
  ways.clear();
  for (uint64_t op = 4 * Chooser::kProbeEvery + 2; op < 5 * Chooser::kProbeEvery + 1; ++op) {
    const Chooser::Pick p = both(op, microseconds(50), microseconds(120));
    const bool ordinary = op >= 5 * Chooser::kProbeEvery - 3 && op < 5 * Chooser::kProbeEvery;
    EXPECT_EQ(p.stream, !ordinary) << "op " << op;
  }
  EXPECT_EQ(timed, (std::vector<uint64_t>{639, 640}));
  EXPECT_EQ(ways, (std::vector<bool>{false, true}));
  EXPECT_TRUE(a.seen(Chooser::kReduce, kMiB).stream);  // one probe: not yet
  EXPECT_DOUBLE_EQ(a.seen(Chooser::kReduce, kMiB).cached_ns, 50e3);
  for (uint64_t op = 5 * Chooser::kProbeEvery + 1; op < 6 * Chooser::kProbeEvery + 1; ++op) {
    both(op, microseconds(50), microseconds(120));
  }
  EXPECT_FALSE(a.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_FALSE(b.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_FALSE(a.pick(Chooser::kReduce, kMiB).stream);
}

// Runs a class's five warm-up ops on c with these times, leaving out those whose bit is set in
// `disturbed` (bit i: op i); whether any of them switched the class.
bool warm_up(Chooser& c, size_t bytes, const microseconds (&times)[5], unsigned disturbed) {
  bool switched = false;
  for (int i = 0; i < 5; ++i) {
    const Chooser::Pick p = c.pick(Chooser::kReduce, bytes);
    switched |= c.record(p, times[i], ((disturbed >> i) & 1) != 0);
  }
  return switched;
}

// Runs c's ops of `bytes` up to and including the probe starting at op `start`, with the given
// times (and disturbed as given, the probe's ordinary op only); true where the probe switched.
bool probe_at(Chooser& c, size_t bytes, uint64_t start, microseconds cached, microseconds streamed,
              bool cached_disturbed = false) {
  bool switched = false;
  for (int reports = 0; reports < 2;) {
    const Chooser::Pick p = c.pick(Chooser::kReduce, bytes);
    if (!p.timed) continue;
    if (p.round != start) {
      ADD_FAILURE() << "op " << p.op << " is timed for " << p.round << "; the probe was to start"
                    << " at op " << start;
      return switched;
    }
    switched |= c.record(p, p.stream ? streamed : cached, !p.stream && cached_disturbed);
    ++reports;
  }
  return switched;
}

// Beside a build: one probe whose ordinary op took a preempted peer's slice (9 ms against 0.45)
// does not switch the class; the next probe, undisturbed, finds ordinary stores faster again and
// the lean is forgotten, so that another lone slow probe later does not switch it either. Two in
// a row do.
TEST(PublishChooser, OneProbeSlowedByAPreemptionDoesNotSwitch) {
  Chooser c;
  for (int i = 0; i < 5; ++i) run(c, 2 * kMiB, microseconds(400), microseconds(460));
  ASSERT_FALSE(c.seen(Chooser::kReduce, 2 * kMiB).stream);
  EXPECT_FALSE(probe_at(c, 2 * kMiB, 8, microseconds(9000), microseconds(450)));
  EXPECT_FALSE(c.seen(Chooser::kReduce, 2 * kMiB).stream);
  EXPECT_FALSE(probe_at(c, 2 * kMiB, 16, microseconds(400), microseconds(460)));
  EXPECT_FALSE(probe_at(c, 2 * kMiB, 32, microseconds(9000), microseconds(450)));
  EXPECT_FALSE(c.seen(Chooser::kReduce, 2 * kMiB).stream);
  EXPECT_TRUE(probe_at(c, 2 * kMiB, 64, microseconds(9000), microseconds(450)));
  EXPECT_TRUE(c.seen(Chooser::kReduce, 2 * kMiB).stream);
}

// A rank that lost its CPU during a timed op leaves that time out, whatever it reads: a warm-up
// decides from each way's undisturbed best (and keeps the ordinary stores where a way has none),
// and a probe with a disturbed op decides nothing, nor counts toward two in a row.
TEST(PublishChooser, ATimeDuringWhichTheRankWasPreemptedIsLeftOut) {
  // Warm-up ways: ordinary thrice (op 2 timed), streaming twice. Op 3's 100 us, disturbed, would
  // have switched to streaming stores; left out, streaming's best is op 4's 950 against 900.
  Chooser c;
  EXPECT_FALSE(warm_up(c, 4 * kMiB,
                       {microseconds(1500), microseconds(1200), microseconds(900),
                        microseconds(100), microseconds(950)},
                       1u << 3));
  EXPECT_FALSE(c.seen(Chooser::kReduce, 4 * kMiB).stream);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, 4 * kMiB).streamed_ns, 950e3);
  // Op 2, the ordinary stores' one time, disturbed: no ordinary time, and the ordinary stores
  // stay, however fast the streaming ones read (ops 0 and 1 are not timed).
  Chooser d;
  EXPECT_FALSE(warm_up(d, 4 * kMiB,
                       {microseconds(1500), microseconds(1500), microseconds(1500),
                        microseconds(800), microseconds(800)},
                       1u << 2));
  EXPECT_FALSE(d.seen(Chooser::kReduce, 4 * kMiB).stream);
  // Probes whose ordinary op was disturbed: streaming reads 10x faster in three of them, in a
  // row, and nothing switches; two undisturbed ones then do.
  EXPECT_FALSE(probe_at(d, 4 * kMiB, 8, microseconds(9000), microseconds(800), true));
  EXPECT_FALSE(probe_at(d, 4 * kMiB, 16, microseconds(9000), microseconds(800), true));
  EXPECT_FALSE(probe_at(d, 4 * kMiB, 32, microseconds(9000), microseconds(800), true));
  EXPECT_FALSE(d.seen(Chooser::kReduce, 4 * kMiB).stream);
  EXPECT_FALSE(probe_at(d, 4 * kMiB, 64, microseconds(9000), microseconds(800)));
  EXPECT_TRUE(probe_at(d, 4 * kMiB, 128, microseconds(9000), microseconds(800)));
}

TEST(PublishChooser, ABatchsSendsPickBeforeAnyReportsAndTheRoundWaitsForAllOfThem) {
  // A batch of five sends of one class picks all five warm-up ops at once; their times come back
  // in another order, the streaming one reported last the slower (streaming keeps its best).
  Chooser c;
  std::vector<Chooser::Pick> picks;
  for (int i = 0; i < 5; ++i) picks.push_back(c.pick(Chooser::kSend, 4 * kMiB));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(picks[i].op, static_cast<uint64_t>(i));
  EXPECT_FALSE(c.record(picks[0], microseconds(100)));    // not timed: no report
  EXPECT_FALSE(c.record(picks[3], microseconds(450)));    // streaming
  EXPECT_FALSE(c.record(picks[4], microseconds(2000)));   // streaming
  EXPECT_FALSE(c.seen(Chooser::kSend, 4 * kMiB).stream);  // not decided before op 2 reports
  EXPECT_TRUE(c.record(picks[2], microseconds(900)));     // ordinary
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kSend, 4 * kMiB).cached_ns, 900e3);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kSend, 4 * kMiB).streamed_ns, 450e3);
  EXPECT_TRUE(c.seen(Chooser::kSend, 4 * kMiB).stream);

  // A probe one of whose ops failed (never reported) decides nothing: a send's probe is one
  // ordinary op (7), timed, then the streaming one (8), picked together.
  for (uint64_t op = 5; op < 7; ++op) EXPECT_TRUE(c.pick(Chooser::kSend, 4 * kMiB).stream);
  const Chooser::Pick ordinary = c.pick(Chooser::kSend, 4 * kMiB);
  const Chooser::Pick streaming = c.pick(Chooser::kSend, 4 * kMiB);
  EXPECT_TRUE(ordinary.timed && !ordinary.stream);
  EXPECT_TRUE(streaming.timed && streaming.stream);
  EXPECT_FALSE(c.record(ordinary, microseconds(100)));  // faster; op 8 never reports
  EXPECT_TRUE(c.seen(Chooser::kSend, 4 * kMiB).stream);
  // The next probes (ops 15 and 16, 31 and 32) report in full, in one order and then the other:
  // the second of them puts the ordinary stores back (two in a row).
  for (uint64_t start : {uint64_t{16}, uint64_t{32}}) {
    while (c.pick(Chooser::kSend, 4 * kMiB).op + 2 < start) {
    }
    const Chooser::Pick o = c.pick(Chooser::kSend, 4 * kMiB);
    const Chooser::Pick st = c.pick(Chooser::kSend, 4 * kMiB);
    ASSERT_EQ(o.op, start - 1);
    EXPECT_FALSE(o.stream);
    EXPECT_TRUE(st.stream);
    const Chooser::Pick& first = start == 16 ? st : o;
    const Chooser::Pick& second = start == 16 ? o : st;
    EXPECT_FALSE(c.record(first, first.stream ? microseconds(450) : microseconds(100)));
    EXPECT_EQ(c.record(second, second.stream ? microseconds(450) : microseconds(100)), start == 32);
  }
  EXPECT_FALSE(c.seen(Chooser::kSend, 4 * kMiB).stream);

  // A batch that reaches past the warm-up into the first probe, its reports interleaved: the
  // warm-up and the probe keep their own counts, and each decides.
  Chooser d;
  picks.clear();
  for (int i = 0; i < 9; ++i) picks.push_back(d.pick(Chooser::kSend, 4 * kMiB));
  EXPECT_FALSE(d.record(picks[2], microseconds(900)));
  EXPECT_FALSE(d.record(picks[3], microseconds(450)));
  EXPECT_FALSE(d.record(picks[7], microseconds(900)));
  EXPECT_TRUE(d.record(picks[4], microseconds(460)));   // the warm-up: streaming
  EXPECT_FALSE(d.record(picks[8], microseconds(450)));  // the probe: streaming still faster
  EXPECT_TRUE(d.seen(Chooser::kSend, 4 * kMiB).stream);
}

// Ranks that chose differently (one left a warm-up time out that the other kept) time the same
// ways on the same ops, so the next probes bring them together: here the CPUs are far apart, and
// an op is fast (110 us) only where both ranks stream.
TEST(PublishChooser, RanksThatChoseDifferentlyMeetAtTheNextProbes) {
  Chooser a, b;
  for (int i = 0; i < 5; ++i) {
    const Chooser::Pick pa = a.pick(Chooser::kReduce, kMiB);
    const Chooser::Pick pb = b.pick(Chooser::kReduce, kMiB);
    const microseconds t = pa.stream && pb.stream ? microseconds(110) : microseconds(500);
    a.record(pa, t, i == 3 || i == 4);  // a was preempted in both streaming ops
    b.record(pb, t);
  }
  ASSERT_FALSE(a.seen(Chooser::kReduce, kMiB).stream);
  ASSERT_TRUE(b.seen(Chooser::kReduce, kMiB).stream);
  for (uint64_t op = 5; op < 17; ++op) {
    const Chooser::Pick pa = a.pick(Chooser::kReduce, kMiB);
    const Chooser::Pick pb = b.pick(Chooser::kReduce, kMiB);
    EXPECT_EQ(pa.timed, pb.timed) << "op " << op;
    if (pa.timed) EXPECT_EQ(pa.stream, pb.stream) << "op " << op;
    const microseconds t = pa.stream && pb.stream ? microseconds(110) : microseconds(500);
    a.record(pa, t);
    b.record(pb, t);
  }
  EXPECT_TRUE(a.seen(Chooser::kReduce, kMiB).stream);  // two probes, at ops 8 and 16
  EXPECT_TRUE(b.seen(Chooser::kReduce, kMiB).stream);
  EXPECT_TRUE(a.pick(Chooser::kReduce, kMiB).stream);
}

TEST(PublishChooser, AWayNotTenPercentFasterDoesNotTakeOver) {
  Chooser c;
  for (int i = 0; i < 5; ++i) run(c, 64 * kMiB, microseconds(6500), microseconds(6800));
  ASSERT_FALSE(c.seen(Chooser::kReduce, 64 * kMiB).stream);
  for (uint64_t op = 5; op < Chooser::kProbeEvery + 2; ++op) {
    run(c, 64 * kMiB, microseconds(6500), microseconds(6000));  // 7.7% faster
  }
  EXPECT_FALSE(c.seen(Chooser::kReduce, 64 * kMiB).stream);
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, 64 * kMiB).streamed_ns, 6000e3);
  for (uint64_t op = Chooser::kProbeEvery + 2; op < 3 * Chooser::kProbeEvery + 2; ++op) {
    run(c, 64 * kMiB, microseconds(6500), microseconds(5800));  // 10.8% faster, in two probes
  }
  EXPECT_TRUE(c.seen(Chooser::kReduce, 64 * kMiB).stream);
}

TEST(PublishChooser, AClockThatStepsBackCountsAsANanosecond) {
  Chooser c;
  for (int i = 0; i < 2; ++i) c.pick(Chooser::kReduce, kMiB);
  const Chooser::Pick p = c.pick(Chooser::kReduce, kMiB);  // op 2: ordinary stores' time
  ASSERT_TRUE(p.timed);
  c.record(p, -microseconds(3));
  for (int i = 3; i < 5; ++i) run(c, kMiB, microseconds(50), microseconds(120));
  EXPECT_DOUBLE_EQ(c.seen(Chooser::kReduce, kMiB).cached_ns, 1);
  EXPECT_FALSE(c.seen(Chooser::kReduce, kMiB).stream);  // 1 ns beats 120 us: still a number
  for (uint64_t op = 5; op < Chooser::kProbeEvery + 2; ++op) {
    run(c, kMiB, microseconds(500), microseconds(110));
  }
  EXPECT_TRUE(c.seen(Chooser::kReduce, kMiB).stream);  // the probes' times replace it
}

// Runs on this thread's CPU until its CPU time has grown by `ms` milliseconds.
void burn_cpu(int64_t ms) {
  const int64_t until = thread_cpu_ns() + ms * 1000000;
  volatile uint64_t x = 0;
  while (thread_cpu_ns() < until) {
    for (int i = 0; i < 1000; ++i) x = x + 1;
  }
}

// A timed op's cost: the rank's CPU time up to its first publish and after its first barrier,
// less its waits at the later barriers (ShmBackend::sync reports them through the slot).
TEST(PublishTimer, CountsTheRanksCpuTimeOutsideItsWaitsAndOutsideTheFirstBarrier) {
  const Chooser::Pick how{0, false, true, 2, Chooser::kWarmupRound};  // a timed op
  PublishTimer* slot = nullptr;
  std::chrono::nanoseconds work{};
  {
    PublishTimer timer(how, slot);
    EXPECT_EQ(slot, &timer);  // the op's barriers report to it
    burn_cpu(2);              // the first publish: counted
    timer.published();
    // The first barrier: its wait (spun or asleep) is not the op's cost.
    timer.wait_begins();
    burn_cpu(3);
    timer.wait_ends();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    timer.met();
    burn_cpu(2);        // reducing and copying: counted
    timer.published();  // the next chunks' publishes and barriers change no start
    timer.wait_begins();
    burn_cpu(5);  // a later barrier, spun while a peer was late: not counted
    timer.wait_ends();
    timer.met();
    // Off its CPU (as if another process had it): wall time, no CPU time.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    burn_cpu(1);  // the last copies: counted
    EXPECT_TRUE(timer.complete());
    work = std::chrono::duration_cast<std::chrono::nanoseconds>(timer.work());
  }
  EXPECT_EQ(slot, nullptr);  // gone with the timer
  // 2 + 2 + 1 ms, and the few microseconds of the calls between the burns (a wall clock would
  // read 45 ms, CPU time with the waits 13).
  EXPECT_GE(work, std::chrono::milliseconds(5));
  EXPECT_LT(work, std::chrono::milliseconds(6));
}

// A broadcast's root times its op with no slot: its later waits (its readers' copies) count.
TEST(PublishTimer, WithoutASlotTheWaitsAfterTheFirstBarrierCount) {
  const Chooser::Pick how{0, false, true, 2, Chooser::kWarmupRound};
  PublishTimer timer(how);
  burn_cpu(1);
  timer.published();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the first barrier: not counted
  timer.met();
  burn_cpu(3);  // spun at a later barrier while the readers copied: counted
  const auto work = std::chrono::duration_cast<std::chrono::nanoseconds>(timer.work());
  EXPECT_GE(work, std::chrono::milliseconds(4));
  EXPECT_LT(work, std::chrono::milliseconds(5));
}

// Ops under kCpuTimedBytes (a few microseconds: the small path's, from kMinBytes) are timed by
// the wall clock, since a read of the thread's CPU time costs ~0.5 us on some VMs; larger ones
// by their CPU time. Every kind has classes from kMinBytes, the small path's included.
TEST(PublishChooser, OpsUnderKCpuTimedBytesAreTimedByTheWallClock) {
  Chooser c;
  for (Chooser::Kind kind : {Chooser::kSmallReduce, Chooser::kSmallAllgather, Chooser::kReduce}) {
    const Chooser::Pick small = c.pick(kind, 8 << 10);
    EXPECT_GE(small.cell, 0) << Chooser::name(kind);
    EXPECT_TRUE(small.wall) << Chooser::name(kind);
    EXPECT_FALSE(c.pick(kind, Chooser::kCpuTimedBytes).wall) << Chooser::name(kind);
  }
  EXPECT_TRUE(c.pick(Chooser::kReduce, Chooser::kCpuTimedBytes - 1).wall);
  EXPECT_EQ(c.pick(Chooser::kSmallReduce, 4096).cell, -1);  // below kMinBytes: ordinary stores
  EXPECT_STREQ(Chooser::name(Chooser::kSmallReduce), "small allreduces");
  // The classes of the two paths are apart: the small path's 8 KiB ops left kReduce's alone.
  EXPECT_EQ(c.pick(Chooser::kReduce, 8 << 10).op, 1u);
  // With more ranks than cores, CPU time at every size.
  c.allow_wall_clock(false);
  EXPECT_FALSE(c.pick(Chooser::kSmallReduce, 8 << 10).wall);
  EXPECT_GE(c.pick(Chooser::kSmallReduce, 8 << 10).cell, 0);
}

// A wall-clock time over kWallLeftOut (a preemption inside an op of microseconds) is left out,
// and a round whose ops came to be timed by another clock (the ranks came to outnumber the
// cores) starts again: neither decides a warm-up that would otherwise take streaming stores.
TEST(PublishChooser, APreemptedWallClockTimeAndAClockChangeDecideNothing) {
  using std::chrono::microseconds;
  constexpr size_t kSize = 16 << 10;
  // The warm-up's ops 2, 3 and 4 (ordinary, streaming, streaming) with these times.
  auto warm_up = [&](Chooser& c, microseconds ordinary, microseconds streaming, bool change) {
    for (int i = 0; i < 2; ++i) c.pick(Chooser::kSmallReduce, kSize);
    const Chooser::Pick p2 = c.pick(Chooser::kSmallReduce, kSize);
    c.record(p2, ordinary);
    if (change) c.allow_wall_clock(false);
    for (int i = 3; i < 5; ++i) {
      const Chooser::Pick p = c.pick(Chooser::kSmallReduce, kSize);
      EXPECT_TRUE(p.timed && p.stream);
      c.record(p, streaming);
    }
  };
  Chooser plain;
  warm_up(plain, microseconds(9), microseconds(3), false);
  EXPECT_TRUE(plain.seen(Chooser::kSmallReduce, kSize).stream);  // the check itself can fail
  Chooser preempted;
  warm_up(preempted, microseconds(9), Chooser::kWallLeftOut + microseconds(1), false);
  EXPECT_FALSE(preempted.seen(Chooser::kSmallReduce, kSize).stream);
  Chooser slow_ordinary;  // an ordinary op preempted: left out, so no comparison
  warm_up(slow_ordinary, Chooser::kWallLeftOut + microseconds(1), microseconds(3), false);
  EXPECT_FALSE(slow_ordinary.seen(Chooser::kSmallReduce, kSize).stream);
  Chooser changed;
  warm_up(changed, microseconds(9), microseconds(3), true);
  EXPECT_FALSE(changed.seen(Chooser::kSmallReduce, kSize).stream);
}

// A wall-clock timer counts the same stretches as the CPU-time one: time off the CPU before the
// first publish counts, the first barrier's wait and the later waits do not.
TEST(PublishTimer, AWallClockTimerCountsTheStretchesOutsideTheWaits) {
  using std::chrono::milliseconds;
  using Clock = PublishTimer::Clock;
  Chooser::Pick how{0, false, true, 2, Chooser::kWarmupRound};
  how.wall = true;
  PublishTimer* slot = nullptr;
  // Each call bracketed by clock reads: the counted stretches lie between the brackets' inner
  // and outer ends, however long the sleeps overran.
  const Clock::time_point a0 = Clock::now();
  PublishTimer timer(how, slot);
  const Clock::time_point a1 = Clock::now();
  std::this_thread::sleep_for(milliseconds(3));  // before the first publish: counted
  const Clock::time_point b0 = Clock::now();
  timer.published();
  const Clock::time_point b1 = Clock::now();
  std::this_thread::sleep_for(milliseconds(20));  // the first barrier: not counted
  const Clock::time_point c0 = Clock::now();
  timer.met();
  const Clock::time_point c1 = Clock::now();
  std::this_thread::sleep_for(milliseconds(2));  // counted
  const Clock::time_point d0 = Clock::now();
  timer.wait_begins();
  const Clock::time_point d1 = Clock::now();
  std::this_thread::sleep_for(milliseconds(20));  // a later barrier's wait: not counted
  const Clock::time_point e0 = Clock::now();
  timer.wait_ends();
  const Clock::time_point e1 = Clock::now();
  std::this_thread::sleep_for(milliseconds(1));  // counted
  const Clock::time_point f0 = Clock::now();
  const Clock::duration work = timer.work();
  const Clock::time_point f1 = Clock::now();
  EXPECT_GE(work, (b0 - a1) + (d0 - c1) + (f0 - e1));
  EXPECT_LE(work, (b1 - a0) + (d1 - c0) + (f1 - e0));
  EXPECT_GE(work, milliseconds(6));
}

TEST(PublishTimer, AnUntimedOpReadsNoClockAndTakesNoSlot) {
  PublishTimer* slot = nullptr;
  PublishTimer timer(Chooser::Pick{}, slot);
  EXPECT_EQ(slot, nullptr);
  timer.published();
  timer.met();
  EXPECT_TRUE(timer.complete());
  EXPECT_EQ(timer.work(), PublishTimer::Clock::duration{});
}

// A rank other than 0 compares rank 0's layout, published beside the segment's name, with its
// own before it opens anything (the segments named here do not exist): a different one, or none
// (a build from before the check), fails by name.
TEST(ShmSegmentLayout, ARankComparesRankZerosLayoutBeforeItOpensTheSegment) {
  auto message = [](const std::string& published) {
    HashStore store;
    store.set("shm/segment", published);
    try {
      ShmSegment(store, "layout-test", 1, 2, 1 << 20, 1 << 20, "v1 chunk 1048576");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kRemoteError) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for " << published;
    return std::string();
  };
  const std::string other = message("/tutti-seg-none\nv1 chunk 2097152");
  EXPECT_NE(other.find("out as [v1 chunk 2097152], rank 1 as [v1 chunk 1048576]"),
            std::string::npos)
      << other;
  const std::string older = message("/tutti-seg-none");
  EXPECT_NE(older.find("without its layout: it runs a tutti build older than rank 1's"),
            std::string::npos)
      << older;
  // The same layout gets past the check to the segment itself (absent here: its own error).
  HashStore store;
  store.set("shm/segment", "/tutti-seg-none-layout-test\nv1 chunk 1048576");
  try {
    ShmSegment(store, "layout-test", 1, 2, 1 << 20, 1 << 20, "v1 chunk 1048576");
    ADD_FAILURE() << "opened a segment nobody made";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.what();
    EXPECT_NE(std::string(e.what()).find("opening segment"), std::string::npos) << e.what();
  }
}

TEST(StreamCopy, CopiesEveryLengthAndAlignmentAsMemcpyWould) {
  // Lengths around the streaming threshold and the 64-byte lines, at every offset within a line,
  // into a buffer whose bytes around the target must stay as they were.
  std::vector<uint8_t> src(3 * detail::kStreamCopyMin + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, detail::kStreamCopyMin - 1,
                   detail::kStreamCopyMin, detail::kStreamCopyMin + 1, detail::kStreamCopyMin + 63,
                   2 * detail::kStreamCopyMin + 100}) {
    for (size_t dst_off = 0; dst_off < 64; dst_off += 7) {
      for (size_t src_off : {size_t{0}, size_t{5}, size_t{32}}) {
        std::vector<uint8_t> dst(n + 256, 0xEE);
        detail::stream_copy(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const uint8_t want = i >= dst_off && i < dst_off + n ? src[src_off + i - dst_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "n " << n << ", dst offset " << dst_off << ", src offset "
                                  << src_off << ", byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tutti::shm_backend
