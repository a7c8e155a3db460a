#include "group/op_check.h"

#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <map>

#include "group/group_util.h"
#include "tutti/error.h"

namespace tutti::detail {
namespace {

constexpr uint32_t kMagic = 0x31504654;  // "TFP1"

// The tag of every fingerprint exchange: independent of the op, so ranks that called different
// ops (or the same op at different sequence numbers) still meet and compare.
uint32_t check_tag() {
  static const uint32_t tag = [] {
    Fnv1a h;
    for (char c : std::string("tutti: compare the ranks' ops")) h.mix(static_cast<uint8_t>(c));
    return static_cast<uint32_t>(h.value() ^ (h.value() >> 32));
  }();
  return tag;
}

}  // namespace

std::string Fingerprint::str() const {
  if (magic != kMagic) return "(not a tutti op: an older version, or garbage)";
  OpSignature sig;
  sig.op = static_cast<OpType>(op);
  std::string out = std::string(to_string(sig.op)) + " #" + std::to_string(seq);
  if (sig.op == OpType::kBarrier) return out;
  out += std::string(" ") + to_string(static_cast<DType>(dtype)) + "[";
  if (ndim == 255) {
    out += std::to_string(count);
  } else {
    for (int d = 0; d < ndim && d < kMaxDims; ++d) out += (d ? ", " : "") + std::to_string(dims[d]);
    if (ndim > kMaxDims) out += ", ...";
  }
  out += "]";
  return out + signature_tail(devices, root, root_tensor, reduce_op, layout);
}

Fingerprint fingerprint(uint64_t seq, const OpSignature& sig, const Shape* shape) {
  Fingerprint f;
  f.magic = kMagic;
  f.op = static_cast<uint8_t>(sig.op);
  f.dtype = static_cast<uint8_t>(sig.dtype);
  f.reduce_op = static_cast<int8_t>(sig.reduce_op);
  f.seq = seq;
  f.count = sig.count;
  f.root = sig.root;
  f.root_tensor = sig.root_tensor;
  f.devices = sig.devices;
  f.layout = sig.layout;
  if (shape == nullptr || shape->size() >= 255) {
    f.ndim = 255;
  } else {
    f.ndim = static_cast<uint8_t>(shape->size());
    Fnv1a h;
    for (size_t d = 0; d < shape->size(); ++d) {
      if (d < static_cast<size_t>(Fingerprint::kMaxDims)) f.dims[d] = (*shape)[d];
      h.mix(static_cast<uint64_t>((*shape)[d]));
    }
    f.shape_hash = h.value();
  }
  return f;
}

void check_fingerprints(Backend& backend, const OpContext& ctx, const Fingerprint& mine) {
  const int world = ctx.world_size;
  std::vector<Fingerprint> all(static_cast<size_t>(world));
  Fingerprint sent = mine;
  TensorView in(&sent, DType::kUInt8, {static_cast<int64_t>(sizeof(Fingerprint))});
  TensorView out(all.data(), DType::kUInt8, {static_cast<int64_t>(sizeof(Fingerprint)) * world});
  OpContext check = ctx;
  check.tag = check_tag();
  check.signature = OpSignature{};
  check.signature.op = OpType::kAllgather;
  check.signature.count = static_cast<int64_t>(sizeof(Fingerprint));
  try {
    auto work = backend.allgather_into(out, in, AllgatherOptions{}, check);
    if (work) work->wait();
  } catch (const Error& e) {
    throw Error(e.code(), std::string(e.what()) +
                              " (while the ranks compared their ops: TUTTI_DEBUG=DETAIL)");
  }
  bool same = true;
  for (const Fingerprint& f : all) same &= std::memcmp(&f, &mine, sizeof(Fingerprint)) == 0;
  if (same) return;
  // Ranks grouped by what they called, in rank order of each group's first rank.
  std::vector<std::pair<std::string, std::string>> groups;  // (what, ranks)
  std::map<std::string, size_t> index;                      // by the fingerprint's bytes
  for (int r = 0; r < world; ++r) {
    const Fingerprint& f = all[static_cast<size_t>(r)];
    const std::string bytes(reinterpret_cast<const char*>(&f), sizeof(f));
    auto it = index.find(bytes);
    if (it == index.end()) {
      index.emplace(bytes, groups.size());
      groups.push_back({f.str(), "rank " + std::to_string(r)});
    } else {
      std::string& ranks = groups[it->second].second;
      if (ranks.rfind("rank ", 0) == 0 && ranks.find(',') == std::string::npos) {
        ranks = "ranks " + ranks.substr(5);
      }
      ranks += ", " + std::to_string(r);
    }
  }
  std::string diff;
  for (const auto& [what, ranks] : groups)
    diff += (diff.empty() ? "" : "; ") + ranks + " called " + what;
  throw Error(ErrorCode::kInvalidUsage,
              ctx.description() + ": the ranks called different ops: " + diff +
                  " (found by the op check, TUTTI_DEBUG=DETAIL; no data moved, the group stays "
                  "usable)");
}

bool check_ops_from_env() {
  const char* v = std::getenv("TUTTI_DEBUG");
  return v != nullptr && ::strcasecmp(v, "DETAIL") == 0;
}

}  // namespace tutti::detail
