#include "shm_publish.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

// A class's first ops: ordinary, ordinary, ordinary (timed), streaming (timed), streaming (timed).
constexpr uint64_t kWarmup = 5;
constexpr uint64_t kWarmupTimes = 3;
// Ordinary stores run warm from the third in a row: the first writes lines that streaming
// stores (or a first touch) left in memory alone, whose ownership a core fetches from memory
// first, and the second, where an op fits one staging half, the other half's lines likewise.
constexpr uint64_t kOrdinaryRun = 3;
constexpr double kBetter = 0.9;  // the other way takes over below this many of the chosen's time

}  // namespace

const char* PublishChooser::name(Kind kind) {
  switch (kind) {
    case kReduce: return "allreduces and reduces";
    case kAllgather: return "allgathers";
    case kReduceScatter: return "reduce_scatters";
    case kBroadcast: return "broadcasts";
    case kSend: return "sends";
    case kSmallReduce: return "small allreduces";
    case kSmallAllgather: return "small allgathers";
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
  if (op < kProbeEvery) return op >= 8 && (op & (op - 1)) == 0;  // 8, 16, 32, 64
  return op % kProbeEvery == 0;
}

PublishChooser::Pick PublishChooser::pick(Kind kind, size_t bytes) {
  if (mode_ != Mode::kAuto) return Pick{-1, mode_ == Mode::kStreamed, false};
  if (bytes < kMinBytes) return Pick{};
  Pick p = pick_in(kind, bytes);
  p.wall = wall_ok_ && bytes < kCpuTimedBytes;
  return p;
}

PublishChooser::Pick PublishChooser::pick_in(Kind kind, size_t bytes) {
  const int cell = static_cast<int>(kind) * kClasses + class_of(bytes);
  Cell& c = cells_[static_cast<size_t>(cell)];
  const uint64_t op = c.ops++;  // taken here: a batch's sends pick before any of them is done
  if (op < kWarmup) {
    return Pick{cell, op >= kOrdinaryRun, op + 1 >= kOrdinaryRun, op, kWarmupRound};
  }
  // A probe: ordinary stores for a run of ops (a send's third chunk already rewrites a mailbox
  // slot its first wrote: one op), the last of them timed, then one streaming op, timed; by the
  // op count alone, whichever way the class (or a peer's) has chosen.
  if (probe_starts(op)) return Pick{cell, true, true, op, op};
  const uint64_t run = kind == kSend ? 1 : kOrdinaryRun;
  for (uint64_t k = 1; k <= run; ++k) {
    if (probe_starts(op + k)) return Pick{cell, false, k == 1, op, op + k};
  }
  return Pick{cell, c.stream, false, op};
}

bool PublishChooser::record(const Pick& pick, Clock::duration took, bool disturbed) {
  if (pick.cell < 0 || !pick.timed) return false;
  Cell& c = cells_[static_cast<size_t>(pick.cell)];
  // At least a nanosecond: op_now() may step back by a little (util/op_clock.h).
  const double t = std::max(
      1.0, static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
  // The times of one round (the warm-up, or a probe) may come in any order (a batch's sends,
  // whose picks may reach past the warm-up into the first probe: the two keep their own
  // counts): a round decides once all of its timed ops have reported; a round one of whose ops
  // failed leaves the way as it was.
  const bool warmup = pick.round == kWarmupRound;
  Round& r = warmup ? c.warmup : c.probe;
  if (!warmup && pick.round != c.probe_start) {
    c.probe_start = pick.round;
    r = Round{};
  }
  // The times of a round are all of one clock: where the ranks came to outnumber the cores (or no
  // longer do) between two of its ops, it starts again (a warm-up that does so decides nothing:
  // ordinary stores until the probes).
  if (r.reports > 0 && r.wall != pick.wall) r = Round{};
  r.wall = pick.wall;
  // A time during which this rank was off its CPU (another thread's slice) measures that slice,
  // not the way: it is left out (a probe short of one of its times decides nothing; the warm-up
  // decides from each way's undisturbed best, and keeps the ordinary stores where a way has
  // none). So are a send's (ShmBackend::published) and a wall-clock time over kWallLeftOut; a
  // collective's CPU time (PublishTimer) never is.
  if (pick.wall && took > kWallLeftOut) disturbed = true;
  if (!disturbed) {
    const uint8_t way = pick.stream ? 2 : 1;
    double& mine = r.ns[pick.stream];
    mine = (r.seen & way) != 0 ? std::min(mine, t) : t;  // the warm-up: streaming's best of two
    r.seen |= way;
  }
  if (++r.reports < (warmup ? kWarmupTimes : 2)) return false;
  if (r.seen == 3) c.ns = r.ns;
  if (warmup) {
    // From the ordinary stores classes start with, where each way has a time to compare and
    // streaming stores are 10% faster: the class's first ops warm the user's buffers, and the
    // streaming ones, timed last, gain by it (8 MiB: ordinary 2016 us at op 2 against streaming
    // 1973 at op 4, and 1428 against 1684 in the probes that followed).
    const bool was = c.stream;
    c.stream = r.seen == 3 && r.ns[1] < kBetter * r.ns[0];
    return c.stream != was;
  }
  if (r.seen != 3) return false;
  // The other way takes over once it has been 10% faster in two probes in a row: one probe
  // whose op on the chosen way lost time to something else (a send's wall time to the receiver's
  // preemption, which this rank cannot tell from the way's own; a collective's CPU time to a
  // cache another process emptied) no longer switches a class for the 128 ops up to the next
  // probe. A probe short of a time (left out, or an op that failed) neither counts toward the two
  // nor breaks them.
  if (!(r.ns[!c.stream] < kBetter * r.ns[c.stream])) {
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
