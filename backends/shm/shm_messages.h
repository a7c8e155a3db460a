// The shm transport's messages between a consumer and an owner (internal), in the transports'
// codec (tutti/transport_codec.h). Each side reads what another process wrote, so both are
// parsed strictly (every field, nothing left over) and fuzzed (tests/fuzz/fuzz_shm_setup.cc).
//   consumer -> owner: 'B' u8, block id u64
//   owner -> consumer: the block's offset in its file u64, its bytes u64 (> 0), its slot in the
//                      table of live blocks i64 (0: not listed); with the file's descriptor (and
//                      the table's) attached
// And the shm backend's symmetric memory (shm_symmetric.h): each rank's descriptor, which the
// group's allgather hands to every other rank:
//   bytes u64 (> 0), name str8 ("/tutti-sym-..." without another '/')
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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
