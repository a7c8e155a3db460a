// The cuda_ipc transport's part of a ref (internal), read by every consumer, so with bounds checks
// and fuzzed (tests/fuzz/fuzz_ref_places.cc). Without CUDA's headers: the handles are kept as
// the bytes CUDA gives them (the transport checks that its types are these sizes).
//   the owner's GPU UUID (16 bytes), the object's event handle (64)
//   for each tensor: its allocation's memory handle (64), the tensor's offset in the allocation
//   u64, the allocation's size u64, its buffer id u64, its base address at the owner u64
//   (an empty tensor: zeros)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tutti/tensor_ref.h"
#include "tutti/transport_codec.h"

namespace tutti::cuda_ipc {

constexpr size_t kIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;

// Where each tensor of a ref lies at the owner.
struct Place {
  IpcHandleBytes handle{};
  uint64_t offset = 0, size = 0, buffer_id = 0, base = 0;
};
struct Places {
  std::array<uint8_t, 16> uuid{};  // the owner's GPU
  IpcHandleBytes event{};          // recorded after the producer's writes
  std::vector<Place> places;       // one per tensor
  bool any = false;                // a tensor with bytes
};

// Error(kInvalidArgument) naming the field or the tensor for bytes missing or left over, and for
// a tensor that lies past the end of the allocation the ref gives it (whose real size the
// consumer checks once it has opened it).
inline Places read_places(const TensorRef& ref) {
  const auto& metas = ref.tensors();
  WireReader r(ref.blob(), "cuda_ipc transport: the ref's bytes");
  Places p;
  r.bytes(p.uuid.data(), p.uuid.size(), "the GPU's UUID");
  r.bytes(p.event.data(), p.event.size(), "the event's handle");
  p.places.resize(metas.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    Place& place = p.places[i];
    r.bytes(place.handle.data(), place.handle.size(), "a memory handle");
    place.offset = r.u64("an offset");
    place.size = r.u64("an allocation size");
    place.buffer_id = r.u64("a buffer id");
    place.base = r.u64("an owner's address");
    const uint64_t bytes = metas[i].nbytes();
    if (bytes == 0) continue;
    p.any = true;
    if (bytes > place.size || place.offset > place.size - bytes) {  // no 64-bit wrap
      r.fail("tensor " + std::to_string(i) + " (" + std::to_string(bytes) + " bytes at offset " +
             std::to_string(place.offset) + ") lies past its allocation's end (" +
             std::to_string(place.size) + " bytes)");
    }
  }
  r.finish();
  return p;
}

}  // namespace tutti::cuda_ipc
