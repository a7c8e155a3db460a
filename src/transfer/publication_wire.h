// A publication on the agents' wire (internal to the direct transport): the owner's replies to
// kWait (a reserved object, once fulfilled) and kPublish (an object on a second transport) carry
// the transport's bytes and each tensor's place.
#pragma once

#include <string>
#include <utility>

#include "tutti/tensor_ref.h"
#include "tutti/tensor_transport.h"
#include "tutti/transport_codec.h"

namespace tutti::detail {

inline void write_publication(WireWriter& w, const Publication& p, size_t tensors) {
  w.str32(p.blob);
  w.u32(static_cast<uint32_t>(tensors));
  for (size_t i = 0; i < tensors; ++i) {
    const auto place = i < p.places.size() ? p.places[i] : std::pair<uint16_t, uint64_t>{0, 0};
    w.u16(place.first);
    w.u64(place.second);
  }
}

// kInternal unless it describes `tensors` tensors.
inline Publication read_publication(WireReader& r, size_t tensors) {
  Publication pub;
  pub.blob = r.str32("transport bytes", TensorRef::kMaxBlob);
  const uint32_t n = r.u32("tensors");
  if (n != tensors) {
    throw Error(ErrorCode::kInternal, "the owner describes " + std::to_string(n) +
                                          " tensors, the ref " + std::to_string(tensors));
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint16_t region = r.u16("region");
    pub.places.emplace_back(region, r.u64("offset"));
  }
  return pub;
}

}  // namespace tutti::detail
