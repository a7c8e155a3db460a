// Mismatch detection (opt-in: TUTTI_DEBUG=DETAIL or GroupOptions::check_ops): before each
// collective the ranks exchange a fingerprint of it (op, sequence number, dtype, shape, root,
// reduce op) through the backend, and every rank fails the op with the same diff when they
// disagree (internal to the core).
//
// Without it, ranks that call different ops never exchange data (their tags differ) but learn of
// it only as a timeout (Gloo) or as a kRemoteError that aborts the group (shm). With it, the
// disagreement is found before any data moves, named rank by rank, and leaves the group usable:
// every rank saw the same fingerprints and skipped the same op. It costs one small allgather per
// collective (see docs/RELIABILITY.md for the figure).
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/backend.h"
#include "tutti/op_type.h"
#include "tutti/tensor_view.h"

namespace tutti::detail {

struct Fingerprint {
  static constexpr int kMaxDims = 5;
  uint32_t magic = 0;
  uint8_t op = 0;
  uint8_t dtype = 0;
  int8_t reduce_op = -1;
  uint8_t ndim = 0;  // 255: the shape is unknown (only the count)
  uint64_t seq = 0;
  int64_t count = 0;
  int32_t root = -1;
  int32_t root_tensor = 0;
  int32_t devices = 1;
  uint32_t reserved = 0;
  uint64_t layout = 0;
  int64_t dims[kMaxDims] = {};
  uint64_t shape_hash = 0;  // of every dimension, for shapes longer than kMaxDims

  // "allreduce #5 float32[2, 3] sum"
  std::string str() const;
};
static_assert(sizeof(Fingerprint) == 96, "fingerprints travel as 96 bytes");

// The fingerprint of collective `seq` with this signature; `shape` may be null.
Fingerprint fingerprint(uint64_t seq, const OpSignature& sig, const Shape* shape);

// Exchanges fingerprints with every rank (an allgather through `backend` under a tag of its
// own) and throws Error(kInvalidUsage) naming the ranks that disagree and what each called.
// A failure of the exchange itself is rethrown with its code, saying so.
void check_fingerprints(Backend& backend, const OpContext& ctx, const Fingerprint& mine);

// Whether TUTTI_DEBUG asks for the check (DETAIL, case-insensitive).
bool check_ops_from_env();

}  // namespace tutti::detail
