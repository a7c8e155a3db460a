#include "shm_publish.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

constexpr uint64_t kWarmup = 4;  // ops alternating the two ways before the first choice
constexpr double kBetter = 0.9;  // the other way takes over below this many of the chosen's time

}  // namespace

const char* PublishChooser::name(Kind kind) {
  switch (kind) {
    case kReduce: return "allreduces and reduces";
    case kAllgather: return "allgathers";
    case kReduceScatter: return "reduce_scatters";
    case kBroadcast: return "broadcasts";
    case kSend: return "sends";
    case kKinds: break;
  }
  return "ops";
}

PublishChooser::Mode PublishChooser::mode_from_env() {
  const char* v = std::getenv("TUTTI_SHM_PUBLISH");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Mode::kAuto;
  if (std::strcmp(v, "cached") == 0) return Mode::kCached;
  if (std::strcmp(v, "streamed") == 0) return Mode::kStreamed;
  TUTTI_LOG_WARN("shm: TUTTI_SHM_PUBLISH='{}' is not auto, cached or streamed: using auto", v);
  return Mode::kAuto;
}

int PublishChooser::class_of(size_t bytes) {
  int c = 0;
  for (size_t b = bytes / kMinBytes; b > 1 && c < kClasses - 1; b >>= 1) ++c;
  return c;
}

size_t PublishChooser::class_floor(size_t bytes) {
  return bytes < kMinBytes ? 0 : kMinBytes << class_of(bytes);
}

bool PublishChooser::probe_starts(uint64_t op) {
  if (op < kWarmup) return false;
  if (op < kProbeEvery) return (op & (op - 1)) == 0 && op >= 2 * kWarmup;  // 8, 16, 32, 64
  return op % kProbeEvery == 0;
}

bool PublishChooser::streamed_first(uint64_t start) {
  if (start < kProbeEvery) return (__builtin_ctzll(start) & 1) != 0;  // 8, 32: streaming first
  return ((start / kProbeEvery) & 1) != 0;                            // 128, 384, ...
}

PublishChooser::Pick PublishChooser::pick(Kind kind, size_t bytes) {
  if (mode_ != Mode::kAuto) return Pick{-1, mode_ == Mode::kStreamed, false};
  if (bytes < kMinBytes) return Pick{};
  const int cell = static_cast<int>(kind) * kClasses + class_of(bytes);
  Cell& c = cells_[static_cast<size_t>(cell)];
  const uint64_t op = c.ops++;  // taken here: a batch's sends pick before any of them is done
  if (op < kWarmup) return Pick{cell, op == 1 || op == 2, true, op};
  if (probe_starts(op)) return Pick{cell, streamed_first(op), true, op};
  if (probe_starts(op - 1)) return Pick{cell, !streamed_first(op - 1), true, op};
  return Pick{cell, c.stream, false, op};
}

bool PublishChooser::record(const Pick& pick, Clock::duration took, bool disturbed) {
  if (pick.cell < 0 || !pick.timed) return false;
  Cell& c = cells_[static_cast<size_t>(pick.cell)];
  // At least a nanosecond: op_now() may step back by a little (util/op_clock.h).
  const double t = std::max(
      1.0, static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
  // The times of one round (the warm-up, or a probe pair) may come in any order (a batch's
  // sends): the round decides once all of its ops have reported; a round one of whose ops
  // failed leaves the way as it was.
  const bool warmup = pick.op < kWarmup;
  const uint64_t round = warmup ? 0 : probe_starts(pick.op) ? pick.op : pick.op - 1;
  if (round != c.round) {
    c.round = round;
    c.seen = 0;
    c.reports = 0;
  }
  // A time during which this rank lost its CPU to another thread measures the other thread's
  // slice, not the way: it is left out (a probe pair short of one of its times decides nothing;
  // the warm-up decides from each way's undisturbed best, and keeps the ordinary stores where a
  // way has none).
  if (!disturbed) {
    const uint8_t way = pick.stream ? 2 : 1;
    double& mine = c.ns[pick.stream];
    mine = (c.seen & way) != 0 ? std::min(mine, t) : t;  // the warm-up: each way's best of two
    c.seen |= way;
    // Op 0's ordinary time counts its page faults: the warm-up needs op 3's beside it.
    if (warmup && !pick.stream && pick.op != 0) c.seen |= 4;
  }
  if (++c.reports < (warmup ? kWarmup : 2)) return false;
  if (warmup) {
    // From the ordinary stores classes start with, where each way has a time to compare.
    c.stream = (c.seen & 6) == 6 && c.ns[1] < c.ns[0];
    return c.stream;
  }
  if (c.seen != 3) return false;
  // The other way takes over once it has been 10% faster in two probe pairs in a row: one pair
  // whose op on the chosen way lost time to a peer's preemption (a time this rank cannot tell
  // from the way's own) no longer switches a class for the 128 ops up to the next pair. A pair
  // short of a time (left out, or an op that failed) neither counts toward the two nor breaks
  // them.
  if (!(c.ns[!c.stream] < kBetter * c.ns[c.stream])) {
    c.leaning = false;
    return false;
  }
  if (!c.leaning) {
    c.leaning = true;
    return false;
  }
  c.leaning = false;
  c.stream = !c.stream;
  return true;
}

PublishChooser::Seen PublishChooser::seen(Kind kind, size_t bytes) const {
  if (mode_ != Mode::kAuto) return Seen{mode_ == Mode::kStreamed, 0, 0};
  if (bytes < kMinBytes) return Seen{};
  const Cell& c = cells_[static_cast<size_t>(kind) * kClasses + class_of(bytes)];
  return Seen{c.stream, c.ns[0], c.ns[1]};
}

}  // namespace tutti::shm_backend
