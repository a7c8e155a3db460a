#include "shm_publish.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

constexpr std::chrono::milliseconds kExploreMin{200};
constexpr std::chrono::milliseconds kExploreMax{2000};
constexpr double kExploreOps = 100;  // ops' worth of time between two timings of the other way
constexpr double kOutlier = 4;       // a time counts as at most this many means
constexpr double kStale = 1.5;       // the chosen way's mean past this many of the other's: look
constexpr double kBetter = 0.9;      // the other way takes over below this many of the mean

}  // namespace

const char* PublishChooser::name(Kind kind) {
  switch (kind) {
    case kReduce: return "allreduces and reduces";
    case kAllgather: return "allgathers";
    case kReduceScatter: return "reduce_scatters";
    case kBroadcast: return "broadcasts";
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

int PublishChooser::cell_of(Kind kind, size_t bytes) {
  int c = 0;
  for (size_t b = bytes / kMinBytes; b > 1 && c < kClasses - 1; b >>= 1) ++c;
  return static_cast<int>(kind) * kClasses + c;
}

bool PublishChooser::explore_due(const Cell& c) const {
  const double chosen = c.mean_ns[c.stream];
  if (chosen > kStale * c.mean_ns[!c.stream]) return true;
  const auto every = std::clamp<Clock::duration>(
      std::chrono::nanoseconds(static_cast<int64_t>(kExploreOps * chosen)), kExploreMin,
      kExploreMax);
  return last_ - c.explored >= every;
}

PublishChooser::Pick PublishChooser::pick(Kind kind, size_t bytes) const {
  if (mode_ != Mode::kAuto) return Pick{-1, mode_ == Mode::kStreamed, false};
  if (bytes < kMinBytes) return Pick{};
  const int cell = cell_of(kind, bytes);
  const Cell& c = cells_[static_cast<size_t>(cell)];
  if (c.samples < kWarmup) return Pick{cell, (c.samples & 1) != 0, false};
  if (explore_due(c)) return Pick{cell, !c.stream, true};
  return Pick{cell, c.stream, false};
}

bool PublishChooser::record(const Pick& pick, Clock::duration took, Clock::time_point now) {
  if (pick.cell < 0) return false;
  last_ = now;
  Cell& c = cells_[static_cast<size_t>(pick.cell)];
  const double t =
      static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count());
  double& mean = c.mean_ns[pick.stream];
  if (c.samples < kWarmup) {
    mean = c.samples < 2 ? t : std::min(mean, t);
    if (++c.samples < kWarmup) return false;
    c.stream = c.mean_ns[1] < c.mean_ns[0];
    c.explored = now;
    return c.stream;  // a change from the ordinary stores of the classes not yet measured
  }
  if (pick.explore) {
    c.explored = now;
    mean = t;
    if (t >= kBetter * c.mean_ns[c.stream]) return false;
    c.stream = pick.stream;
    return true;
  }
  mean += (std::min(t, kOutlier * mean) - mean) / 4;
  return false;
}

PublishChooser::Seen PublishChooser::seen(Kind kind, size_t bytes) const {
  if (mode_ != Mode::kAuto) return Seen{mode_ == Mode::kStreamed, 0, 0};
  if (bytes < kMinBytes) return Seen{};
  const Cell& c = cells_[static_cast<size_t>(cell_of(kind, bytes))];
  return Seen{c.stream, c.mean_ns[0], c.mean_ns[1]};
}

}  // namespace tutti::shm_backend
