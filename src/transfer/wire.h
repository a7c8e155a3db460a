// Little-endian encoding with bounds-checked decoding, CRC32C and base64url, for references and
// the agents' messages (internal).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tutti/error.h"

namespace tutti::detail {

// Appends fixed-width little-endian integers and length-prefixed strings.
class WireWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i64(int64_t v) { put(static_cast<uint64_t>(v), 8); }
  void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void str8(std::string_view s) {  // length u8
    u8(static_cast<uint8_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void str32(std::string_view s) {  // length u32
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string& out() { return out_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Reads what WireWriter wrote; every read checks the bytes left first and throws
// Error(kInvalidArgument) naming `what` and the field.
class WireReader {
 public:
  WireReader(std::string_view data, std::string what) : data_(data), what_(std::move(what)) {}

  uint8_t u8(const char* field) { return static_cast<uint8_t>(get(1, field)); }
  uint16_t u16(const char* field) { return static_cast<uint16_t>(get(2, field)); }
  uint32_t u32(const char* field) { return static_cast<uint32_t>(get(4, field)); }
  uint64_t u64(const char* field) { return get(8, field); }
  int64_t i64(const char* field) { return static_cast<int64_t>(get(8, field)); }
  void bytes(void* p, size_t n, const char* field) {
    need(n, field);
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
  }
  std::string str8(const char* field) { return take(u8(field), field); }
  std::string str32(const char* field, uint32_t max) {
    const uint32_t n = u32(field);
    if (n > max) fail(std::string(field) + " has " + std::to_string(n) + " bytes, at most " +
                      std::to_string(max) + " allowed");
    return take(n, field);
  }
  size_t left() const { return data_.size() - pos_; }
  size_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kInvalidArgument, what_ + ": " + why);
  }

 private:
  void need(size_t n, const char* field) const {
    if (n > left()) {
      fail(std::string("truncated at ") + field + " (needs " + std::to_string(n) + " bytes, " +
           std::to_string(left()) + " left)");
    }
  }
  uint64_t get(int n, const char* field) {
    need(static_cast<size_t>(n), field);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += static_cast<size_t>(n);
    return v;
  }
  std::string take(size_t n, const char* field) {
    need(n, field);
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }

  std::string_view data_;
  std::string what_;
  size_t pos_ = 0;
};

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
    const uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) |
                       static_cast<uint8_t>(in[i + 2]);
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
