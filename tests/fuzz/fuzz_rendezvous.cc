// JoinRecord::decode: the record each rank stores when it joins a group, which every other rank
// (and a later incarnation's rank 0) reads from the store (group/rendezvous.h). Any text decodes
// to some record (a malformed number reads as 0, a missing line as empty); the record must encode
// to a text that decodes to the same fields and encodes the same again, and describing what it
// says of this process (start_seen_from) must not fail.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "group/rendezvous.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  using tutti::detail::JoinRecord;
  const JoinRecord a = JoinRecord::decode(text);
  const std::string again = a.encode();
  const JoinRecord b = JoinRecord::decode(again);
  if (b.encode() != again || b.world_size != a.world_size || b.backend != a.backend ||
      b.host != a.host || b.pid != a.pid || b.start != a.start || b.nonce != a.nonce ||
      b.left != a.left || b.pidns != a.pidns) {
    std::abort();
  }
  // Only a record of this host and pid namespace says its start time.
  if (a.start_seen_from(a.host + "-elsewhere") != 0) std::abort();
  return 0;
}
