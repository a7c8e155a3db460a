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
// 2.3x slower at 1 MiB where the cores are near. So each rank measures both, per kind of
// collective and size class (powers of two from 64 KiB), and uses the faster:
// - a class's first four ops alternate ordinary, streaming, ordinary, streaming; the faster
//   one's best time wins (a first op's time counts its page faults);
// - then every op of the class uses the chosen way and updates its mean time (each time at most
//   4x the mean: one preempted op does not decide), and the other way is timed once more every
//   100 ops' worth of time (at least 200 ms, at most 2 s) or as soon as the chosen way's mean
//   grew past 1.5x the other's last time; it takes over where it is 10% faster.
// Smaller messages use ordinary stores (where they differ, in this placement or that, neither
// way is ahead). TUTTI_SHM_PUBLISH=cached or streamed fixes the way (for measurements).
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
  enum Kind : uint8_t { kReduce, kAllgather, kReduceScatter, kBroadcast, kKinds };
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr int kWarmup = 4;

  explicit PublishChooser(Mode mode = Mode::kAuto) : mode_(mode) {}
  static const char* name(Kind kind);
  // TUTTI_SHM_PUBLISH: auto (unset), cached or streamed; another value warns and means auto.
  static Mode mode_from_env();

  struct Pick {
    int cell = -1;         // the size class measured, -1: none (a small message, a fixed way)
    bool stream = false;   // streaming stores
    bool explore = false;  // the way not chosen, timed once more
  };
  // How the op of `kind` moving `bytes` per rank publishes.
  Pick pick(Kind kind, size_t bytes) const;
  // The op of `pick` took `took`, ending at `now`; returns true where the class changed its way.
  bool record(const Pick& pick, Clock::duration took, Clock::time_point now);

  // The class's way and mean times (ns; 0: not measured), for logs and tests.
  struct Seen {
    bool stream = false;
    double cached_ns = 0;
    double streamed_ns = 0;
  };
  Seen seen(Kind kind, size_t bytes) const;

 private:
  static constexpr int kClasses = 20;  // 64 KiB, 128 KiB, ..., 2^35 B and above
  struct Cell {
    std::array<double, 2> mean_ns{};  // [cached, streamed]
    Clock::time_point explored{};
    uint8_t samples = 0;
    bool stream = false;
  };
  static int cell_of(Kind kind, size_t bytes);
  bool explore_due(const Cell& c) const;

  Mode mode_;
  Clock::time_point last_{};  // the last op's end
  std::array<Cell, kKinds * kClasses> cells_{};
};

}  // namespace tutti::shm_backend
