// The ucx transport's bytes in a reference (backends/ucx/ucx_blob.h), as a consumer reads them
// from a ref another process made. The first byte picks: the rest as the whole blob, or a blob
// this harness encodes from fuzzed fields (so that inputs reach the checks behind the framing).
// The consumer's targets come from the input too. What describe accepts must hold up: a piece
// per target, each of its target's size, each non-empty one in a region the blob has, and it
// must encode back to the same bytes. Anything else must fail with TUTTI_ERR_INVALID_ARGUMENT.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ucx_blob.h"

using namespace tutti_ucx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool framed = in.ConsumeBool();
  std::vector<tuttiTensor_v1_t> targets(in.ConsumeIntegralInRange<size_t>(0, 16));
  for (auto& t : targets) {
    t.nbytes = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 64)
                                : in.ConsumeIntegral<uint64_t>();
  }
  std::string blob;
  if (framed) {
    const std::string address = in.ConsumeRandomLengthString(64);
    std::vector<std::string> keys(in.ConsumeIntegralInRange<size_t>(0, 8));
    for (auto& k : keys) k = in.ConsumeRandomLengthString(32);
    std::vector<const std::string*> rkeys;
    for (const auto& k : keys) rkeys.push_back(&k);
    std::vector<Piece> pieces(in.ConsumeBool() ? targets.size()
                                               : in.ConsumeIntegralInRange<size_t>(0, 16));
    for (size_t i = 0; i < pieces.size(); ++i) {
      pieces[i].region = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 8)
                                          : in.ConsumeIntegral<uint32_t>();
      pieces[i].address = in.ConsumeIntegral<uint64_t>();
      pieces[i].bytes = i < targets.size() && in.ConsumeBool() ? targets[i].nbytes
                                                               : in.ConsumeIntegral<uint64_t>();
    }
    blob = encode(address, rkeys, pieces);
    // Sometimes cut short or padded.
    if (in.ConsumeBool()) blob.resize(in.ConsumeIntegralInRange<size_t>(0, blob.size() + 4));
  } else {
    blob = in.ConsumeRemainingBytesAsString();
  }
  try {
    const Described d = describe(blob.data(), blob.size(), targets.data(), targets.size());
    if (d.pieces.size() != targets.size()) std::abort();
    for (size_t i = 0; i < d.pieces.size(); ++i) {
      if (d.pieces[i].bytes != targets[i].nbytes) std::abort();
      if (d.pieces[i].bytes > 0 && d.pieces[i].region >= d.rkeys.size()) std::abort();
    }
    std::vector<const std::string*> rkeys;
    for (const auto& k : d.rkeys) rkeys.push_back(&k);
    if (encode(d.address, rkeys, d.pieces) != blob) std::abort();
  } catch (const Failure& f) {
    if (f.code != TUTTI_ERR_INVALID_ARGUMENT) std::abort();
  }
  return 0;
}
