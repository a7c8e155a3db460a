#include "bench_math.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tutti/error.h"

namespace tutti::bench {

const char* to_string(BenchOp op) {
  switch (op) {
    case BenchOp::kAllreduce: return "allreduce";
    case BenchOp::kAllgather: return "allgather";
    case BenchOp::kReduceScatter: return "reduce_scatter";
    case BenchOp::kBroadcast: return "broadcast";
    case BenchOp::kReduce: return "reduce";
    case BenchOp::kSendRecv: return "sendrecv";
    case BenchOp::kBarrier: return "barrier";
    case BenchOp::kAlltoall: return "alltoall";
    case BenchOp::kGather: return "gather";
    case BenchOp::kScatter: return "scatter";
    case BenchOp::kTransfer: return "transfer";
  }
  return "?";
}

bool is_blocked(BenchOp op) {
  return op == BenchOp::kAllgather || op == BenchOp::kReduceScatter || op == BenchOp::kAlltoall ||
         op == BenchOp::kGather || op == BenchOp::kScatter;
}

double bus_factor(BenchOp op, int n) {
  switch (op) {
    case BenchOp::kAllreduce: return 2.0 * (n - 1) / n;
    case BenchOp::kAllgather:
    case BenchOp::kReduceScatter:
    case BenchOp::kAlltoall:
    case BenchOp::kGather:
    case BenchOp::kScatter: return static_cast<double>(n - 1) / n;
    case BenchOp::kBroadcast:
    case BenchOp::kReduce:
    case BenchOp::kSendRecv:
    case BenchOp::kTransfer: return 1.0;
    case BenchOp::kBarrier: return 0.0;
  }
  return 0.0;
}

int64_t elements_per_rank(BenchOp op, uint64_t bytes, size_t element_size, int n) {
  uint64_t count = bytes / element_size;
  if (is_blocked(op)) count /= static_cast<uint64_t>(n);
  if (op == BenchOp::kBarrier) count = 0;
  return op == BenchOp::kBarrier ? 0 : std::max<int64_t>(1, static_cast<int64_t>(count));
}

uint64_t message_bytes(BenchOp op, int64_t per_rank, size_t element_size, int n) {
  uint64_t bytes = static_cast<uint64_t>(per_rank) * element_size;
  if (is_blocked(op)) bytes *= static_cast<uint64_t>(n);
  return bytes;
}

std::vector<uint64_t> sweep(uint64_t min_bytes, uint64_t max_bytes, double factor) {
  std::vector<uint64_t> out;
  for (double s = static_cast<double>(min_bytes); s < static_cast<double>(max_bytes) * (1 - 1e-9);
       s *= factor) {
    const uint64_t v = static_cast<uint64_t>(std::llround(s));
    if (out.empty() || v != out.back()) out.push_back(v);
  }
  if (out.empty() || out.back() != max_bytes) out.push_back(max_bytes);
  return out;
}

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v < 0) return std::nullopt;
  const std::string suffix(end);
  double mult = 1;
  if (suffix == "" || suffix == "B" || suffix == "b") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") {
    mult = 1024.0;
  } else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    return std::nullopt;
  }
  return static_cast<uint64_t>(std::llround(v * mult));
}

namespace {
std::optional<BenchOp> parse_op(const std::string& s) {
  for (BenchOp op : {BenchOp::kAllreduce, BenchOp::kAllgather, BenchOp::kReduceScatter,
                     BenchOp::kBroadcast, BenchOp::kReduce, BenchOp::kSendRecv, BenchOp::kBarrier,
                     BenchOp::kAlltoall, BenchOp::kGather, BenchOp::kScatter, BenchOp::kTransfer}) {
    if (s == to_string(op)) return op;
  }
  if (s == "all_reduce") return BenchOp::kAllreduce;
  if (s == "all_gather") return BenchOp::kAllgather;
  return std::nullopt;
}

std::optional<long> parse_int(const std::string& s, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return std::nullopt;
  return v;
}
}  // namespace

std::optional<std::string> parse_args(int argc, char** argv, Config& c, bool& help) {
  help = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    auto need = [&](const std::string& what) { return "option " + a + " needs " + what; };
    if (a == "-h" || a == "--help") {
      help = true;
      return std::nullopt;
    }
    if (a == "--baseline") {
      c.baseline = true;
      continue;
    }
    if (a == "--symmetric") {
      c.symmetric = true;
      continue;
    }
    if (a == "--async") {
      c.async = true;
      continue;
    }
    const auto v = value();
    if (!v) return need("a value");
    if (a == "--op" || a == "-O") {
      auto op = parse_op(*v);
      if (!op) {
        return "unknown op '" + *v +
               "' (allreduce, allgather, reduce_scatter, broadcast, reduce, sendrecv, barrier, "
               "alltoall, gather, scatter, transfer)";
      }
      c.op = *op;
    } else if (a == "--transport") {
      c.transport = *v;
    } else if (a == "--source") {
      if (*v != "shareable" && *v != "heap") {
        return need("shareable or heap (got '" + *v + "')");
      }
      c.heap_source = *v == "heap";
    } else if (a == "--mode") {
      if (*v != "copy" && *v != "borrow") return need("copy or borrow (got '" + *v + "')");
      c.borrow = *v == "borrow";
    } else if (a == "--backend") {
      c.backend = *v;
    } else if (a == "-b" || a == "--minbytes") {
      auto s = parse_size(*v);
      if (!s || *s == 0) return need("a size such as 8, 64K, 1M (got '" + *v + "')");
      c.min_bytes = *s;
    } else if (a == "-e" || a == "--maxbytes") {
      auto s = parse_size(*v);
      if (!s || *s == 0) return need("a size such as 8, 64K, 1M (got '" + *v + "')");
      c.max_bytes = *s;
    } else if (a == "-f" || a == "--stepfactor") {
      char* end = nullptr;
      const double f = std::strtod(v->c_str(), &end);
      if (*end != '\0' || !(f > 1.0)) return need("a factor above 1 (got '" + *v + "')");
      c.factor = f;
    } else if (a == "-d" || a == "--datatype") {
      try {
        c.dtype = parse_dtype(*v);
      } catch (const Error& e) {
        return std::string(e.what());
      }
    } else if (a == "-o" || a == "--op-type" || a == "--redop") {
      try {
        c.redop = parse_reduce_op(*v);
      } catch (const Error& e) {
        return std::string(e.what());
      }
    } else if (a == "-r" || a == "--root") {
      auto r = parse_int(*v, 0, 1 << 20);
      if (!r) return need("a rank >= 0 (got '" + *v + "')");
      c.root = static_cast<int>(*r);
    } else if (a == "-w" || a == "--warmup_iters") {
      auto r = parse_int(*v, 0, 1 << 20);
      if (!r) return need("a count >= 0 (got '" + *v + "')");
      c.warmup = static_cast<int>(*r);
    } else if (a == "-n" || a == "--iters") {
      auto r = parse_int(*v, 1, 1 << 24);
      if (!r) return need("a count >= 1 (got '" + *v + "')");
      c.iters = static_cast<int>(*r);
    } else if (a == "-T" || a == "--time-budget") {
      char* end = nullptr;
      const double ms = std::strtod(v->c_str(), &end);
      if (*end != '\0' || !(ms > 0)) return need("milliseconds > 0 (got '" + *v + "')");
      c.time_budget_ms = ms;
    } else if (a == "-c" || a == "--check") {
      auto r = parse_int(*v, 0, 1);
      if (!r) return need("0 or 1 (got '" + *v + "')");
      c.check = *r == 1;
    } else if (a == "--json") {
      c.json = *v;
    } else if (a == "--csv") {
      c.csv = *v;
    } else if (a == "--ranks") {
      auto r = parse_int(*v, 1, 4096);
      if (!r) return need("a count >= 1 (got '" + *v + "')");
      c.ranks = static_cast<int>(*r);
    } else if (a == "--debug-corrupt-rank") {
      auto r = parse_int(*v, 0, 1 << 20);
      if (!r) return need("a rank (got '" + *v + "')");
      c.corrupt_rank = static_cast<int>(*r);
    } else {
      return "unknown option '" + a + "'";
    }
  }
  if (c.min_bytes > c.max_bytes) {
    return "-b " + std::to_string(c.min_bytes) + " is larger than -e " +
           std::to_string(c.max_bytes);
  }
  if (c.redop == ReduceOp::kAvg && !is_floating(c.dtype)) {
    return std::string("-o avg needs a floating dtype, got ") + tutti::to_string(c.dtype);
  }
  if (c.async && c.op != BenchOp::kAllreduce) {
    return std::string("--async measures allreduce, not ") + to_string(c.op);
  }
  if (c.async && c.baseline) return "--async and --baseline are separate runs";
  if (c.borrow && c.op != BenchOp::kTransfer) return "--mode is for --op transfer";
  if (c.heap_source && c.op != BenchOp::kTransfer) return "--source is for --op transfer";
  return std::nullopt;
}

}  // namespace tutti::bench
