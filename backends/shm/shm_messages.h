// The shm transport's two text messages between a consumer and an owner (internal): each side
// reads what another process wrote, so both are parsed strictly (decimal digits only, nothing
// left over, no overflow) and fuzzed (tests/fuzz/fuzz_shm_setup.cc).
//   consumer -> owner: "chunk <block id>"
//   owner -> consumer: "ok <offset in the file> <bytes> [<slot in the table of live blocks>]"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tutti::shm_backend {

// Reads a decimal number at the front of `text` into `out` and drops it (and one space after it,
// when `space` says one must follow); false when there is none, it overflows, or the separator
// is missing.
inline bool take_number(std::string_view& text, uint64_t& out, bool space) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
    ++i;
  }
  if (i == 0) return false;
  if (space) {
    if (i >= text.size() || text[i] != ' ') return false;
    ++i;
  }
  out = v;
  text.remove_prefix(i);
  return true;
}

inline std::string chunk_request(uint64_t id) { return "chunk " + std::to_string(id); }

inline bool parse_chunk_request(std::string_view text, uint64_t& id) {
  if (text.substr(0, 6) != "chunk ") return false;
  text.remove_prefix(6);
  return take_number(text, id, false) && text.empty();
}

// slot is 0 (not listed: an owner without a table of live blocks) when the reply has none.
inline std::string chunk_reply(uint64_t at, uint64_t bytes, int64_t slot) {
  return "ok " + std::to_string(at) + " " + std::to_string(bytes) + " " + std::to_string(slot);
}

inline bool parse_chunk_reply(std::string_view text, uint64_t& at, uint64_t& bytes,
                              int64_t& slot) {
  if (text.substr(0, 3) != "ok ") return false;
  text.remove_prefix(3);
  if (!take_number(text, at, false)) return false;
  if (text.empty() || text[0] != ' ') return false;
  text.remove_prefix(1);
  if (!take_number(text, bytes, false) || bytes == 0) return false;
  slot = 0;
  if (text.empty()) return true;
  if (text[0] != ' ') return false;
  text.remove_prefix(1);
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  uint64_t s = 0;
  if (!take_number(text, s, false) || !text.empty() || s > static_cast<uint64_t>(INT64_MAX)) {
    return false;
  }
  slot = negative ? -static_cast<int64_t>(s) : static_cast<int64_t>(s);
  return true;
}

}  // namespace tutti::shm_backend
