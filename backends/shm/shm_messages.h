// The shm transport's messages between a consumer and an owner (internal), in the transports'
// codec (tutti/transport_codec.h). Each side reads what another process wrote, so both are
// parsed strictly (every field, nothing left over) and fuzzed (tests/fuzz/fuzz_shm_setup.cc).
//   consumer -> owner: 'B' u8, block id u64
//   owner -> consumer: the block's offset in its file u64, its bytes u64 (> 0), its slot in the
//                      table of live blocks i64 (0: not listed); with the file's descriptor (and
//                      the table's) attached
// And the transport's part of a ref (read by every consumer; tests/fuzz/fuzz_ref_places.cc):
//   each tensor's place: (kInBlock, offset in the block) or (kInProcess, the owner's address)
//   the blob: for each tensor, its block's id u64 and size u64 (0 and 0 for kInProcess)
// And the shm backend's symmetric memory (shm_symmetric.h): each rank's descriptor, which the
// group's allgather hands to every other rank:
//   bytes u64 (> 0), name str8 ("/tutti-sym-..." without another '/')
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/tensor_ref.h"
#include "tutti/transport_codec.h"

namespace tutti::shm_backend {

constexpr uint8_t kBlockRequest = 'B';

inline std::string block_request(uint64_t id) {
  WireWriter w;
  w.u8(kBlockRequest).u64(id);
  return std::move(w.out());
}

// The block id; Error(kInvalidArgument) for anything else.
inline uint64_t parse_block_request(std::string_view bytes) {
  WireReader r(bytes, "shm transport: a block request");
  if (r.u8("kind") != kBlockRequest) r.fail("not a block request");
  const uint64_t id = r.u64("block id");
  r.finish();
  return id;
}

struct BlockReply {
  uint64_t offset = 0;  // of the block in its file
  uint64_t bytes = 0;
  int64_t slot = 0;  // in the owner's table of live blocks; 0: not listed
};

inline std::string block_reply(const BlockReply& reply) {
  WireWriter w;
  w.u64(reply.offset).u64(reply.bytes).i64(reply.slot);
  return std::move(w.out());
}

inline BlockReply parse_block_reply(std::string_view bytes) {
  WireReader r(bytes, "shm transport: an owner's block reply");
  BlockReply reply;
  reply.offset = r.u64("offset");
  reply.bytes = r.u64("bytes");
  reply.slot = r.i64("slot");
  r.finish();
  if (reply.bytes == 0) r.fail("a block of 0 bytes");
  return reply;
}

// Where a published tensor lies (its place in the ref: kind, then an offset or an address).
constexpr uint16_t kInBlock = 1;    // (kInBlock, offset in the block); the blob names the block
constexpr uint16_t kInProcess = 2;  // (kInProcess, virtual address in the owner)

// One tensor of a ref, as the consumer reads it.
struct RefPlace {
  bool in_block = false;  // else in the owner's process memory (a cross-memory read)
  uint64_t block = 0;     // the owner's id of the block (in_block)
  uint64_t at = 0;        // the offset in the block, or the owner's address
  uint64_t bytes = 0;
};

// The places of a ref's tensors, read with bounds checks: an unknown place kind, a blob of
// another length than 16 bytes a tensor, or an address range past the end of the address space
// is Error(kInvalidArgument) naming the tensor. Whether a tensor lies within its block is
// known only once the block is mapped: check_in_block.
inline std::vector<RefPlace> read_ref_places(const TensorRef& ref) {
  const auto& metas = ref.tensors();
  const auto& places = ref.places();
  WireReader r(ref.blob(), "shm transport: the ref's transport bytes");
  if (places.size() != metas.size()) {  // (a parsed ref has one each; kept for refs made here)
    r.fail(std::to_string(places.size()) + " places for " + std::to_string(metas.size()) +
           " tensors");
  }
  std::vector<RefPlace> out(metas.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    RefPlace& p = out[i];
    p.block = r.u64("block");
    r.u64("block size");  // the block's real size is its mapping's
    p.at = places[i].second;
    p.bytes = metas[i].nbytes();
    if (places[i].first == kInBlock) {
      p.in_block = true;
    } else if (places[i].first != kInProcess) {
      r.fail("tensor " + std::to_string(i) + " has an unknown place " +
             std::to_string(places[i].first));
    } else if (p.bytes > UINT64_MAX - p.at) {
      r.fail("tensor " + std::to_string(i) + " (" + std::to_string(p.bytes) + " bytes at address " +
             std::to_string(p.at) + ") wraps the address space");
    }
  }
  r.finish();
  return out;
}

// Throws Error(kInvalidArgument) unless tensor `index` lies within its block of `size` bytes.
inline void check_in_block(size_t index, const RefPlace& p, uint64_t size) {
  if (p.bytes > size || p.at > size - p.bytes) {  // no 64-bit wrap
    throw Error(ErrorCode::kInvalidArgument,
                "shm transport: tensor " + std::to_string(index) + " (" + std::to_string(p.bytes) +
                    " bytes at offset " + std::to_string(p.at) + ") lies past the end of block " +
                    std::to_string(p.block) + " (" + std::to_string(size) + " bytes)");
  }
}

struct SymmetricDescriptor {
  uint64_t bytes = 0;  // mapped: whole pages, the trailer page not counted
  std::string name;    // of the shared-memory file, for shm_open
};

inline std::string symmetric_descriptor(const SymmetricDescriptor& d) {
  WireWriter w;
  w.u64(d.bytes).str8(d.name);
  return std::move(w.out());
}

inline SymmetricDescriptor parse_symmetric_descriptor(std::string_view bytes) {
  WireReader r(bytes, "shm symmetric memory: a rank's descriptor");
  SymmetricDescriptor d;
  d.bytes = r.u64("bytes");
  d.name = r.str8("name");
  r.finish();
  if (d.bytes == 0) r.fail("a region of 0 bytes");
  if (d.name.rfind("/tutti-sym-", 0) != 0 || d.name.find('/', 1) != std::string::npos ||
      d.name.find('\0') != std::string::npos) {
    r.fail("not a name of tutti's symmetric memory");
  }
  return d;
}

}  // namespace tutti::shm_backend
