// How the shm backend's staged collectives write into the staging areas, chosen by measuring
// (internal; issue 20).
//
// A staged collective copies into its staging area what a peer reads next. With ordinary stores
// the peer takes the lines from this core's cache, the fastest way while the two cores share a
// cache; but a core writing lines a peer has read must first win back each line, and where the
// hypervisor has placed the two vCPUs far apart (a cache line between them in ~270 ns instead of
// ~70; on these VMs it changes within seconds) that made the staged allreduce 4-10x slower from
// 64 KiB (16 MiB in 8.4 ms instead of 1.5). Streaming stores (util/stream_copy.h) do not wait
// for the lines and ran at one speed in either placement, but send the bytes through memory:
// 2.3x slower at 1 MiB where the cores are near. So the ranks time both, per kind of collective
// and size class (powers of two from 64 KiB), and use the faster. Point-to-point sends too
// (through the pair's mailbox; 3.5-6x slower with the CPUs far apart, from 64 KiB): their way is
// the sender's alone, timed from the third chunk's copy (the first two go before the receiver
// need be there) to the last one's, and only for messages of 8 mailbox chunks and more (2 MiB by
// default; shm_p2p.cc says why): smaller ones stay with ordinary stores, and slow where the CPUs
// are far apart (64 KiB 35 us against 10). A broadcast's way is likewise the root's alone.
//
// An op's time is that of every rank's stores together (a rank waits for the others' at the
// barriers), so every rank times the same way on the same op: which ops are timed, and their
// way, go by the class's op count alone, the same on every rank whatever each has chosen (ranks
// that chose differently, after a time one of them left out, meet again at the next probes).
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
// Beside other busy processes (a build), an op during which a rank is preempted takes a slice
// longer whatever its way: such a rank leaves its time out (where it was switched out
// involuntarily within the timed part and off its CPU for more than 1% of it or 200 us, by the
// thread's CPU time: shm_cpus.h's off_cpu_counts; not with more ranks than cores, where the ranks
// hand each other their CPUs at every wait), and the peers, whose times grew by the wait for it,
// need a second probe to agree. With one probe deciding, beside a 2-job build on 2 vCPUs, probes
// whose op on one way took 9-77 ms against 0.4-2 ms on the other switched 2-8 MiB allreduces to
// streaming stores, which ran 1.1-3.7x slower there than ordinary ones (2026-12-06).
// TUTTI_SHM_PUBLISH=cached or streamed fixes the way (for measurements). Smaller messages use
// ordinary stores: where they differ, in either placement, neither way is ahead.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tutti::shm_backend {

class PublishChooser {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Mode : uint8_t { kAuto, kCached, kStreamed };
  enum Kind : uint8_t { kReduce, kAllgather, kReduceScatter, kBroadcast, kSend, kKinds };
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr uint64_t kProbeEvery = 128;  // ops of a class from one probe to the next

  explicit PublishChooser(Mode mode = Mode::kAuto) : mode_(mode) {}
  // TUTTI_SHM_PUBLISH: auto (unset), cached or streamed; another value warns and means auto.
  static Mode mode_from_env();
  static const char* name(Kind kind);

  static constexpr uint64_t kWarmupRound = 0;
  struct Pick {
    int cell = -1;        // the size class, -1: none (a small message, a fixed way)
    bool stream = false;  // streaming stores
    bool timed = false;   // the op is timed (a warm-up op or a probe's): record() its time
    uint64_t op = 0;      // its number in the class
    uint64_t round = kWarmupRound;  // the round it reports to: the warm-up, or a probe's start
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
  static constexpr int kClasses = 20;  // 64 KiB, 128 KiB, ..., 2^35 B and above
  // A round's times: [ordinary, streaming] (the warm-up's streaming one, the better of two).
  struct Round {
    std::array<double, 2> ns{};
    uint8_t seen = 0;  // the ways it has times of (1 ordinary, 2 streaming)
    uint8_t reports = 0;
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
  static bool probe_starts(uint64_t op);  // whether a class's op `op` begins a probe

  Mode mode_;
  std::array<Cell, kKinds * kClasses> cells_{};
};

}  // namespace tutti::shm_backend
