// The TCP store's wire protocol, version 2 (internal; shared by server and client).
//
// Handshake, on connect:
//   server -> client: magic u32, version u16, then (version 2) server id [8 bytes], idle
//                     timeout ms u32 (0: none), largest message u32, nonce [16 bytes]
//   client -> server: magic u32, version u16, proof [32 bytes] = HMAC-SHA-256(secret, nonce)
//                     (zeros without a secret)
//   server -> client: status u8 (kOk, or kDenied and the connection closes)
// The server id is random per server instance: a client that reconnects learns whether it
// reached the same server (its keys are there) or a new one. The idle timeout lets a client
// reconnect before the server would close its idle connection; the largest message lets it
// refuse a value the server would not take, instead of sending it to be cut off. A client reads
// magic and version first, so it can name another version (or a listener that is no tutti store
// at all) at once.
//
// Then requests and responses, each framed as: body length u32, body. A request body is a
// command u8 and its fields; a response body is a status u8 and its fields. Strings are a u32
// length and the bytes. Integers are little-endian. Every length and count received is checked
// against the caps below before anything is allocated.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tutti::detail::tcp_store {

constexpr uint32_t kMagic = 0x54545554;  // "TUTT" on the wire
constexpr uint16_t kVersion = 2;
constexpr size_t kServerIdBytes = 8;
constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;
constexpr size_t kHelloPrefixBytes = 4 + 2;  // magic, version: every version starts so
constexpr size_t kServerHelloBytes = kHelloPrefixBytes + kServerIdBytes + 4 + 4 + kNonceBytes;
constexpr size_t kClientHelloBytes = 4 + 2 + kProofBytes;

constexpr uint32_t kMaxKeyBytes = 64 * 1024;
constexpr uint32_t kMaxValueBytes = 64 * 1024 * 1024;
constexpr uint32_t kMaxKeysPerRequest = 64 * 1024;
constexpr uint32_t kMaxBodyBytes = kMaxValueBytes + 2 * kMaxKeyBytes + 64;
// Message bodies arrive in pieces of at most this, and are allocated as they arrive.
constexpr size_t kReadChunkBytes = 64 * 1024;
// set_on_close registrations one connection may hold.
constexpr size_t kMaxOnCloseKeys = 1024;

enum class Command : uint8_t {
  kSet = 1,          // key, value                 -> kOk
  kGet = 2,          // key                        -> kOk value | kNotFound
  kAdd = 3,          // key, delta i64             -> kOk i64 | kError message [code u8]
  kCompareSet = 4,   // key, expected, desired     -> kOk value
  kWait = 5,         // timeout_ms i64, n u32, keys -> kOk | kTimeout (when it passes)
  kCheck = 6,        // n u32, keys                -> kOk u8
  kDelete = 7,       // key                        -> kOk u8 (existed)
  kNumKeys = 8,      //                            -> kOk i64
  kPing = 9,         //                            -> kOk
  kSetOnClose = 10,  // key, value                 -> kOk | kError message; the server sets key
                     // to value when this connection closes, and no longer times it out as idle
};

enum class Status : uint8_t { kOk = 0, kNotFound = 1, kTimeout = 2, kError = 3, kDenied = 4 };

class Writer {
 public:
  Writer& u8(uint8_t v) { return raw(&v, 1); }
  Writer& u16(uint16_t v) { return raw(&v, 2); }
  Writer& u32(uint32_t v) { return raw(&v, 4); }
  Writer& i64(int64_t v) { return raw(&v, 8); }
  Writer& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_ += s;
    return *this;
  }
  Writer& raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  // The body with its length prefix.
  std::string framed() const {
    std::string out(4, '\0');
    const uint32_t n = static_cast<uint32_t>(buf_.size());
    std::memcpy(out.data(), &n, 4);
    return out + buf_;
  }
  const std::string& body() const { return buf_; }

 private:
  std::string buf_;
};

// Reads fields from a received body; any read past the end or over a cap sets !ok() and
// returns zero values, so a malformed message is detected once, at the end.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && p_ == end_; }

  uint8_t u8() { return num<uint8_t>(); }
  uint16_t u16() { return num<uint16_t>(); }
  uint32_t u32() { return num<uint32_t>(); }
  int64_t i64() { return num<int64_t>(); }
  std::string str(uint32_t cap) {
    const uint32_t n = u32();
    if (!ok_ || n > cap || static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<std::string> keys() {
    const uint32_t n = u32();
    std::vector<std::string> out;
    if (!ok_ || n > kMaxKeysPerRequest || n > static_cast<size_t>(end_ - p_) / 4) {
      ok_ = false;
      return out;
    }
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(str(kMaxKeyBytes));
    return out;
  }

 private:
  template <typename T>
  T num() {
    T v{};
    if (!ok_ || static_cast<size_t>(end_ - p_) < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }

  const char* p_;
  const char* end_;
  bool ok_ = true;
};

}  // namespace tutti::detail::tcp_store
