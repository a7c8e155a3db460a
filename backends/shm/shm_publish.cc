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

PublishChooser::Pick PublishChooser::pick(Kind kind, size_t bytes) const {
  if (mode_ != Mode::kAuto) return Pick{-1, mode_ == Mode::kStreamed, false};
  if (bytes < kMinBytes) return Pick{};
  const int cell = static_cast<int>(kind) * kClasses + class_of(bytes);
  const Cell& c = cells_[static_cast<size_t>(cell)];
  if (c.ops < kWarmup) return Pick{cell, c.ops == 1 || c.ops == 2, true};
  if (probe_starts(c.ops)) return Pick{cell, streamed_first(c.ops), true};
  if (probe_starts(c.ops - 1)) return Pick{cell, !streamed_first(c.ops - 1), true};
  return Pick{cell, c.stream, false};
}

bool PublishChooser::record(const Pick& pick, Clock::duration took) {
  if (pick.cell < 0) return false;
  Cell& c = cells_[static_cast<size_t>(pick.cell)];
  const uint64_t op = c.ops++;
  if (!pick.timed) return false;
  // At least a nanosecond: op_now() may step back by a little (util/op_clock.h).
  const double t = std::max(
      1.0, static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
  double& mine = c.ns[pick.stream];
  mine = op < 2 || op >= kWarmup ? t : std::min(mine, t);
  if (op + 1 == kWarmup) {  // the warm-up's last op
    c.stream = c.ns[1] < c.ns[0];
    return c.stream;  // from the ordinary stores every class starts with
  }
  if (op < kWarmup || !probe_starts(op - 1)) return false;  // not a probe pair's second op
  const bool faster = c.ns[!c.stream] < kBetter * c.ns[c.stream];
  if (faster) c.stream = !c.stream;
  return faster;
}

PublishChooser::Seen PublishChooser::seen(Kind kind, size_t bytes) const {
  if (mode_ != Mode::kAuto) return Seen{mode_ == Mode::kStreamed, 0, 0};
  if (bytes < kMinBytes) return Seen{};
  const Cell& c = cells_[static_cast<size_t>(kind) * kClasses + class_of(bytes)];
  return Seen{c.stream, c.ns[0], c.ns[1]};
}

}  // namespace tutti::shm_backend
