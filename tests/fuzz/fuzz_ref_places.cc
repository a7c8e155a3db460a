// The transports' own bytes in a ref, as a consumer reads them before it maps, opens or asks for
// anything: shm's places and blocks (backends/shm/shm_messages.h), the two-sided transports'
// group place (GroupTransport::parse_place, gloo and nccl) and cuda_ipc's handles and places
// (backends/cuda_ipc/cuda_ipc_places.h). The ref reaches them as another process's bytes would:
// made from the input, serialised and parsed again (what does not parse is no ref a consumer
// could hold).
//
// Input, little-endian, read from the front (a short input reads as zeros): the transport (u8:
// 0 shm, 1 two-sided, 2 cuda_ipc), the tensor count (u8, at most 8), then per tensor its dtype
// (u8), dimension count (u8, at most 4), dimensions (u32 each), place kind (u16) and place (u64);
// then a block size (u64, for shm's check_in_block); the rest is the transport's bytes.
//
// Properties: each decoder ends in its value or Error(kInvalidArgument), and reads a blob only of
// the length its owner writes (nothing left over). What shm reads matches
// the ref (one place a tensor, the place's offset, the tensor's bytes), and a tensor
// check_in_block accepts lies within the block; cuda_ipc's tensors lie within the allocation
// size the ref gives; a two-sided place names an owner rank within a world of two or more.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_ipc_places.h"
#include "shm_messages.h"
#include "transfer/group_transport.h"
#include "tutti/error.h"
#include "tutti/tensor_ref.h"

namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t take(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      if (pos_ < size_) v |= static_cast<uint64_t>(data_[pos_++]) << (8 * i);
    }
    return v;
  }
  std::string rest() const {
    return pos_ < size_ ? std::string(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_)
                        : std::string();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool within(uint64_t at, uint64_t bytes, uint64_t size) {
  return static_cast<unsigned __int128>(at) + bytes <= size;
}

void shm(const tutti::TensorRef& ref, uint64_t block_size) {
  using namespace tutti::shm_backend;
  const std::vector<RefPlace> places = read_ref_places(ref);
  // What the owner writes, and nothing else: 16 bytes a tensor.
  if (places.size() != ref.tensors().size() || ref.blob().size() != 16 * places.size()) {
    std::abort();
  }
  for (size_t i = 0; i < places.size(); ++i) {
    const RefPlace& p = places[i];
    const auto& place = ref.places()[i];
    if (p.in_block != (place.first == kInBlock) || p.at != place.second ||
        p.bytes != ref.tensors()[i].nbytes()) {
      std::abort();
    }
    if (!p.in_block) {
      if (!within(p.at, p.bytes, UINT64_MAX)) std::abort();
      continue;
    }
    bool fits = true;
    try {
      check_in_block(i, p, block_size);
    } catch (const tutti::Error& e) {
      if (e.code() != tutti::ErrorCode::kInvalidArgument) std::abort();
      fits = false;
    }
    if (fits != within(p.at, p.bytes, block_size)) std::abort();
  }
}

void two_sided(const tutti::TensorRef& ref) {
  const tutti::detail::GroupPlace p = tutti::detail::GroupTransport::parse_place(ref);
  if (p.world < 2 || p.owner_rank < 0 || p.owner_rank >= p.world) std::abort();
  if (ref.blob().size() != 1 + p.set.size() + 8) std::abort();  // str8, world, owner rank
}

void cuda_ipc(const tutti::TensorRef& ref) {
  const tutti::cuda_ipc::Places p = tutti::cuda_ipc::read_places(ref);
  // What the owner writes, and nothing else: 80 bytes, then 96 a tensor.
  if (p.places.size() != ref.tensors().size() || ref.blob().size() != 80 + 96 * p.places.size()) {
    std::abort();
  }
  bool any = false;
  for (size_t i = 0; i < p.places.size(); ++i) {
    const uint64_t bytes = ref.tensors()[i].nbytes();
    if (bytes == 0) continue;
    any = true;
    if (!within(p.places[i].offset, bytes, p.places[i].size)) std::abort();
  }
  if (any != p.any) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const int which = static_cast<int>(in.take(1) % 3);
  const size_t n = in.take(1) % 9;
  std::vector<tutti::TensorMeta> metas(n);
  std::vector<std::pair<uint16_t, uint64_t>> places(n);
  for (size_t i = 0; i < n; ++i) {
    metas[i].dtype = static_cast<tutti::DType>(in.take(1) % 11);
    const size_t dims = in.take(1) % 5;
    for (size_t d = 0; d < dims; ++d) metas[i].shape.push_back(static_cast<int64_t>(in.take(4)));
    if (which == 2) metas[i].device = tutti::Device::cuda(0);
    places[i].first = static_cast<uint16_t>(in.take(2));
    places[i].second = in.take(8);
  }
  const uint64_t block_size = in.take(8);
  static const char* const kNames[] = {"shm", "gloo", "cuda_ipc"};
  tutti::TensorRef ref;
  try {
    const tutti::TensorRef made(tutti::AgentIdentity{}, tutti::ObjectId{1, 1, 0}, kNames[which],
                                std::move(metas), std::move(places), in.rest(), which == 1);
    ref = tutti::TensorRef::parse(made.serialize());
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kInvalidArgument) std::abort();
    return 0;  // not a ref another process could hand over
  }
  try {
    switch (which) {
      case 0: shm(ref, block_size); break;
      case 1: two_sided(ref); break;
      default: cuda_ipc(ref); break;
    }
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kInvalidArgument) std::abort();
  }
  return 0;
}
