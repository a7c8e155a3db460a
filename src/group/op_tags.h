// How an op is named and tagged on the wire (internal; backends may include it): its signature,
// and the tags that keep one op's messages apart from another's.
#pragma once

#include <cstdint>

#include "tutti/op_type.h"
#include "tutti/tensor_view.h"
#include "util/hash.h"

namespace tutti::detail {

// The tag of point-to-point message `seq` from rank src to rank dst of signature `sig`.
inline uint32_t p2p_tag(uint64_t seq, uint64_t sig, int src, int dst) {
  return WordMix()
      .mix(seq)
      .mix(sig)
      .mix(static_cast<uint64_t>(src))
      .mix(static_cast<uint64_t>(dst))
      .folded();
}

// An op's signature: op, dtype and element count of `t`, root and reduce op as given.
inline OpSignature signature_of(OpType op, const TensorView& t, int root = -1, int reduce_op = -1) {
  OpSignature sig;
  sig.op = op;
  sig.dtype = t.dtype();
  sig.count = t.numel();
  sig.root = root;
  sig.reduce_op = reduce_op;
  return sig;
}

// The tag of collective `seq` of signature `sig`: one round over both (sig is a hash already;
// two signatures at one seq still differ in every bit's odds), ~4 ns less on every op's path
// than a round each.
inline uint32_t collective_tag(uint64_t seq, uint64_t sig) {
  return WordMix().mix(seq ^ sig).folded();
}

}  // namespace tutti::detail
