// The byte codec of tutti's wire formats, for transports too: a transport's reference bytes
// (Publication::blob) and its messages between consumer and owner (TransportPeer::call,
// TensorTransport::answer) are read in another process, so every read is bounds-checked and a
// short or oversized field is an Error naming what was read, never a read past the end.
// Integers are little-endian and fixed-width; strings carry a u8 or u32 length.
//
//   tutti::WireWriter w;
//   w.u64(block).u32(flags).str8(name);
//   tutti::WireReader r(bytes, "shm transport: a block reply");
//   uint64_t block = r.u64("block"); ... r.finish();   // nothing may be left over
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "tutti/error.h"

namespace tutti {

// Appends fixed-width little-endian integers and length-prefixed strings.
class WireWriter {
 public:
  WireWriter& u8(uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  WireWriter& u16(uint16_t v) { return put(v, 2); }
  WireWriter& u32(uint32_t v) { return put(v, 4); }
  WireWriter& u64(uint64_t v) { return put(v, 8); }
  WireWriter& i64(int64_t v) { return put(static_cast<uint64_t>(v), 8); }
  WireWriter& bytes(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  WireWriter& str8(std::string_view s) {  // length u8: at most 255 bytes (longer: truncated)
    const size_t n = s.size() < 255 ? s.size() : 255;
    u8(static_cast<uint8_t>(n));
    out_.append(s.data(), n);
    return *this;
  }
  WireWriter& str32(std::string_view s) {  // length u32
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
    return *this;
  }
  std::string& out() { return out_; }

 private:
  WireWriter& put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
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
    if (n > max)
      fail(std::string(field) + " has " + std::to_string(n) + " bytes, at most " +
           std::to_string(max) + " allowed");
    return take(n, field);
  }
  size_t left() const { return data_.size() - pos_; }
  // Throws unless every byte was read.
  void finish() const {
    if (left() != 0) fail(std::to_string(left()) + " bytes left over");
  }
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

}  // namespace tutti
