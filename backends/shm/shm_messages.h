// The shm transport's messages between a consumer and an owner (internal), in the transports'
// codec (tutti/transport_codec.h). Each side reads what another process wrote, so both are
// parsed strictly (every field, nothing left over) and fuzzed (tests/fuzz/fuzz_shm_setup.cc).
//   consumer -> owner: 'B' u8, block id u64
//   owner -> consumer: the block's offset in its file u64, its bytes u64 (> 0), its slot in the
//                      table of live blocks i64 (0: not listed); with the file's descriptor (and
//                      the table's) attached
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

}  // namespace tutti::shm_backend
