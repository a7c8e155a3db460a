// How the shm backend's staged collectives write into the staging areas, and its small path into
// the ranks' slots, chosen by measuring (internal; issue 20).
//
// A staged collective copies into its staging area what a peer reads next. With ordinary stores
// the peer takes the lines from this core's cache, the fastest way while the two cores share a
// cache; but a core writing lines a peer has read must first win back each line, and where the
// hypervisor has placed the two vCPUs far apart (a cache line between them in ~270 ns instead of
// ~70; on these VMs it changes within seconds) that made the staged allreduce 4-10x slower from
// 64 KiB (16 MiB in 8.4 ms instead of 1.5). Streaming stores (util/stream_copy.h) do not wait
// for the lines and ran at one speed in either placement, but send the bytes through memory:
// 2.3x slower at 1 MiB where the cores are near. So the ranks time both, per kind of collective
// and size class (powers of two from 8 KiB), and use the faster. Point-to-point sends too
// (through the pair's mailbox; 3.5-6x slower with the CPUs far apart, from 64 KiB): their way is
// the sender's alone, timed from the third chunk's copy (the first two go before the receiver
// need be there) to the last one's, and only for messages of 8 mailbox chunks and more (2 MiB by
// default; shm_p2p.cc says why): smaller ones stay with ordinary stores, and slow where the CPUs
// are far apart (64 KiB 35 us against 10). A broadcast's way is likewise the root's alone, and
// a timed broadcast ends with one more barrier, after its readers' last copies, so that the
// root's time holds their reads (shm_collectives.cc).
//
// A rank's cost for an op is its own stores and its reads of what the peers stored (which cost
// more where a peer's were ordinary ones, its lines then in that peer's cache), so every rank
// times the same way on the same op: which ops are timed, and their way, go by the class's op
// count alone, the same on every rank whatever each has chosen (ranks that chose differently,
// their costs a little apart, or a send's time left out on one of them, meet again at the next
// probes).
// Ordinary stores run warm from the third in a row: the first after streaming ones (or a first
// touch) writes lines that sit in memory alone, whose ownership the core fetches from memory
// before it writes, and the second, where an op fits one of the two staging halves that ops take
// in turn, the other half's. Timed right after a streaming op, ordinary stores read up to 1.4x
// slower than they run (1 MiB: 177-239 us against 156-167), and 1-2 MiB classes took and kept
// streaming stores in 3 of 6 runs of the benchmark (2026-12-06). Streaming stores run at one
// speed whatever went before. So a class's ops 0-4 go ordinary, ordinary, ordinary, streaming,
// streaming, and streaming stores take over where the better of ops 3 and 4 is 10% faster than
// op 2 (the first ops also warm the user's buffers, which flatters the way timed last). Then ops
// 8, 16, 32, 64 and every 128th are probes: streaming, timed, after three ordinary ops, the last
// of them timed (one for sends: a send's third chunk already rewrites a slot its first wrote).
// With ordinary stores chosen a probe costs one streaming op; with streaming ones chosen
// (because the CPUs are far apart, where ordinary ones run 4-10x slower), three ordinary ones.
// The other way takes over where it is 10% faster than the chosen one in two probes in a row (a
// tie keeps the way, so that ranks whose times differ a little stay together). Four early
// probes, because two times of each way decided wrongly in about one run of the benchmark in
// five (70 ops a size: the wrong way for all of them). Then, with ordinary stores chosen, 1 op in
// 128 on streaming ones costs ~1% where they are 2.3x slower; with streaming ones chosen, 3 in
// 128 on ordinary ones 7-21% where those are 4-10x slower (one op timed cold would cost a third of
// that, but could not tell when the CPUs came near again: the class stayed on streaming stores).
// A collective's cost to a rank is its thread's CPU time in the op (under 64 KiB, the wall
// clock's time: see the small path below), less its waits at the barriers (PublishTimer below;
// a broadcast's root counts its waits, its readers' copies):
// neither a late peer nor another process that took the rank's CPU adds to it. Beside other busy
// processes (a build) nearly every op of a few milliseconds has one or the other, whatever its way:
// the wall clock's times (before 2026-12-07) varied 0.1-13x between the ways from op to op
// there, were left out wherever the rank had been preempted (20-22 of 22 timed ops at 32-64 MiB),
// and the classes stayed on ordinary stores with the CPUs far apart, 3-4x slower than streaming
// ones (at 16 MiB 20-22 ms against 6.5; Open MPI 16). The CPU times put streaming at 0.26-0.42 of
// ordinary there and at 1.06-2.9 of it with the CPUs near, as quiet. A send's cost is its
// wall time from its third chunk (it waits for the receiver's acks, and the receiver's reads are
// part of it), left out where the sender was off its CPU for more than 1% of it or 200 us
// (shm_cpus.h's off_cpu_counts; not with more ranks than cores, where the ranks hand each other
// their CPUs at every wait). TUTTI_SHM_PUBLISH=cached or streamed fixes the way (for measurements).
// The small path (allreduce and allgather up to kSmallBytes: every rank copies its whole tensor
// into its slot, the others read it from there; a reduce's stays ordinary, as its non-roots'
// times do not hold the root's reads) and the staged path's smallest sizes are chosen the same
// way, from kMinBytes. On an AMD EPYC VM (2026-12-07, 2 ranks; docs/PERFORMANCE.md), with a line
// between the CPUs in ~250 ns: ordinary stores 8 KiB 4.5 us, 16 KiB 9.3, 32 KiB (staged) 18.4,
// streaming ones 1.9, 2.7 and 4.8; with the CPUs near (~40 ns), 8 KiB 1.2 against 1.8, 16-32 KiB
// within 10% of each other. Under 8 KiB ordinary stores: at 4 KiB streaming ones gain little far
// (1.4 against 1.3 us) and lose much near (0.4 against 1.1), and the probes of a 4 KiB class cost
// 14% in the mean of a 60-op run there. Ops of a few microseconds are timed by the wall clock
// (Pick::wall, under kCpuTimedBytes): a read of the thread's CPU time took ~520 ns there, a wall
// clock's ~24; a time over kWallLeftOut (a preemption's) is left out. Not with more ranks than
// cores (allow_wall_clock), where a rank's wall time holds the others' slices: CPU time there.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "shm_cpus.h"

namespace tutti::shm_backend {

class PublishChooser {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Mode : uint8_t { kAuto, kCached, kStreamed };
  // kSmallReduce, kSmallAllgather: the one-step path of allreduce and of allgather, up to
  // kSmallBytes (every rank publishes its whole tensor in its slot).
  enum Kind : uint8_t {
    kReduce,
    kAllgather,
    kReduceScatter,
    kBroadcast,
    kSend,
    kSmallReduce,
    kSmallAllgather,
    kKinds
  };
  // The smallest size timed (see above: under it ordinary stores).
  static constexpr size_t kMinBytes = size_t{8} << 10;
  // Ops under it are timed by the wall clock rather than the thread's CPU time (see
  // PublishTimer).
  static constexpr size_t kCpuTimedBytes = size_t{64} << 10;
  // A wall-clock time over this is left out: a few microseconds' op that took it lost its CPU to
  // another process (a build beside the job) meanwhile.
  static constexpr std::chrono::microseconds kWallLeftOut{200};
  static constexpr uint64_t kProbeEvery = 128;  // ops of a class from one probe to the next

  explicit PublishChooser(Mode mode = Mode::kAuto) : mode_(mode) {}
  // TUTTI_SHM_PUBLISH: auto (unset), cached or streamed; another value warns and means auto.
  static Mode mode_from_env();
  // Whether ops under kCpuTimedBytes may be timed by the wall clock (Pick::wall): not with more
  // ranks than cores, where a rank's wall time holds the slices of the others it hands its CPU.
  void allow_wall_clock(bool ok) { wall_ok_ = ok; }
  static const char* name(Kind kind);

  static constexpr uint64_t kWarmupRound = 0;
  struct Pick {
    int cell = -1;        // the size class, -1: none (a small message, a fixed way)
    bool stream = false;  // streaming stores
    bool timed = false;   // the op is timed (a warm-up op or a probe's): record() its time
    uint64_t op = 0;      // its number in the class
    uint64_t round = kWarmupRound;  // the round it reports to: the warm-up, or a probe's start
    bool wall = false;  // timed by the wall clock (under kCpuTimedBytes, allow_wall_clock)
  };
  // How the next op of `kind` moving `bytes` per rank publishes; counts it. Every rank picks
  // for the same ops of a collective (before anything that could end the op early).
  Pick pick(Kind kind, size_t bytes);
  // The timed op of `pick` took `took`; `disturbed`: this rank lost its CPU to another thread
  // meanwhile (the time is left out). True where the class changed its way.
  bool record(const Pick& pick, Clock::duration took, bool disturbed = false);

  // The class's way and its latest times of each (ns; 0: not yet timed), for logs and tests.
  struct Seen {
    bool stream = false;
    double cached_ns = 0;
    double streamed_ns = 0;
  };
  Seen seen(Kind kind, size_t bytes) const;
  // The smallest size of the class of `bytes` (for logs).
  static size_t class_floor(size_t bytes);

 private:
  static constexpr int kClasses = 23;  // 8 KiB, 16 KiB, ..., 2^35 B and above
  // A round's times: [ordinary, streaming] (the warm-up's streaming one, the better of two).
  struct Round {
    std::array<double, 2> ns{};
    uint8_t seen = 0;  // the ways it has times of (1 ordinary, 2 streaming)
    uint8_t reports = 0;
    bool wall = false;  // its times are the wall clock's
  };
  struct Cell {
    std::array<double, 2> ns{};  // the latest complete round's
    uint64_t ops = 0;            // picked so far
    Round warmup;
    Round probe;
    uint64_t probe_start = ~uint64_t{0};  // the probe reporting
    bool stream = false;
    bool leaning = false;  // the last complete probe found the other way 10% faster
  };
  static int class_of(size_t bytes);
  Pick pick_in(Kind kind, size_t bytes);  // pick() for a timed size
  static bool probe_starts(uint64_t op);  // whether a class's op `op` begins a probe

  Mode mode_;
  bool wall_ok_ = true;
  std::array<Cell, kKinds * kClasses> cells_{};
};

// A timed staged op's cost to this rank: its thread's CPU time from the start to its first
// publish and from its first barrier to its end, less that of its waits at the barriers after the
// first. Neither a peer that came late (this rank waits) nor another process that took this
// rank's CPU meanwhile (it was not on its CPU) adds to it: beside a build, nearly every op of
// 16 MiB and up had one or the other, and a wall-clock time had to be left out (2026-12-07). What
// the way costs, this rank's stores and its reads of what the peers stored, is all in it. A
// broadcast's root, which alone times it, reads nothing: its waits are its readers' copies of
// what it stored, so they count (the timer without a slot), as a send's wait for the receiver's
// acks does (and a timed broadcast's last barrier follows its readers' last copies). An op under
// kCpuTimedBytes (Pick::wall) counts the wall clock's time over the same stretches (the small
// path: its publish, and its reads once every peer's payload is there). Untimed ops read no
// clock.
class PublishTimer {
 public:
  using Clock = PublishChooser::Clock;

  // `slot` is the op's Op::timer: its barriers report their waits to this timer while it lives.
  PublishTimer(const PublishChooser::Pick& how, PublishTimer*& slot) : PublishTimer(how) {
    if (on_) {
      slot_ = &slot;
      slot = this;
    }
  }
  // A timer whose waits count (a broadcast's root), or that has none to hear of (the small
  // path).
  explicit PublishTimer(const PublishChooser::Pick& how) : on_(how.timed), wall_(how.wall) {
    if (on_) counted_ns_ = -now_ns();
  }
  ~PublishTimer() {
    if (slot_ != nullptr) *slot_ = nullptr;
  }
  PublishTimer(const PublishTimer&) = delete;
  PublishTimer& operator=(const PublishTimer&) = delete;

  void published() {  // this rank's first publish is done
    if (on_ && !published_) {
      published_ = true;
      counted_ns_ += now_ns();
    }
  }
  // The first barrier is passed on the staged path, or every peer's payload is there on the small
  // one (after published()).
  void met() {
    staged_ = true;
    if (on_ && !met_) {
      met_ = true;
      counted_ns_ -= now_ns();
    }
  }
  // A barrier's wait after the first begins / ends (ShmBackend::sync, through the slot).
  void wait_begins() {
    if (met_) counted_ns_ += now_ns();
  }
  void wait_ends() {
    if (met_) counted_ns_ -= now_ns();
  }
  // Whether the op got past its first barrier, or the small path's wait (a timed one's cost is
  // then work()).
  bool complete() const { return staged_; }
  // The cost so far (at least a nanosecond; where the thread's CPU time cannot be read, every
  // op costs that, and the ways tie: ordinary stores stay).
  Clock::duration work() const {
    if (!on_) return Clock::duration{};
    const int64_t ns = met_ ? counted_ns_ + now_ns() : counted_ns_;
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::nanoseconds(std::max<int64_t>(1, ns)));
  }

 private:
  int64_t now_ns() const {
    return wall_ ? std::chrono::duration_cast<std::chrono::nanoseconds>(
                       Clock::now().time_since_epoch())
                       .count()
                 : thread_cpu_ns();
  }

  bool on_;
  bool wall_ = false;
  PublishTimer** slot_ = nullptr;
  bool staged_ = false;
  bool published_ = false;
  bool met_ = false;
  int64_t counted_ns_ = 0;  // the time counted so far (less the open span's start while one is)
};

}  // namespace tutti::shm_backend
