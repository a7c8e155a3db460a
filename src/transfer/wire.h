// CRC32C, base64url and error replies for references and the agents' messages (internal); their
// little-endian encoding is the transports' codec (tutti/transport_codec.h).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tutti/error.h"
#include "tutti/transport_codec.h"

namespace tutti::detail {

// An agent's error reply, which the other side rethrows: code u8, message.
inline std::string error_payload(const Error& e) {
  WireWriter w;
  w.u8(static_cast<uint8_t>(e.code()));
  w.str32(e.what());
  return std::move(w.out());
}

[[noreturn]] inline void throw_error_payload(const std::string& payload) {
  WireReader r(payload, "an agent's error");
  const uint8_t code = r.u8("code");
  const std::string what = r.str32("message", 1u << 20);
  throw Error(code <= static_cast<uint8_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code)
                                                                 : ErrorCode::kInternal,
              what);
}

// CRC-32C (Castagnoli), bit-reflected, table-driven.
inline uint32_t crc32c(std::string_view data, uint32_t crc = 0) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// base64url without padding (RFC 4648 section 5).
inline std::string base64url_encode(std::string_view in) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(in[i]) << 16) |
                       (static_cast<uint8_t>(in[i + 1]) << 8) | static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
  } else if (i + 2 == in.size()) {
    const uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
  }
  return out;
}

// The inverse; false on a character outside the alphabet or an impossible length.
inline bool base64url_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
  };
  if (in.size() % 4 == 1) return false;
  out.clear();
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = value(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

}  // namespace tutti::detail
