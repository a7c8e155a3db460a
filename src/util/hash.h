// Two small non-cryptographic hashes (internal): for names, op fingerprints and tags. The
// cryptographic ones (SHA-256, HMAC) are in util/crypto.h.
#pragma once

#include <cstdint>

namespace tutti::detail {

// 64-bit FNV-1a, byte by byte (for names); mix() folds more values in.
class Fnv1a {
 public:
  Fnv1a& mix(uint64_t value) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (value >> (8 * i)) & 0xffu;
      hash_ *= 0x100000001b3ull;
    }
    return *this;
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

// Folds 64-bit words into a hash, a word at a time (splitmix64's finaliser): cheap enough for
// every op, and every input bit reaches every output bit.
class WordMix {
 public:
  WordMix& mix(uint64_t v) {
    uint64_t z = (hash_ ^ v) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    hash_ = z ^ (z >> 31);
    return *this;
  }
  uint64_t value() const { return hash_; }
  uint32_t folded() const { return static_cast<uint32_t>(hash_ ^ (hash_ >> 32)); }

 private:
  uint64_t hash_ = 0x6a09e667f3bcc909ull;
};

}  // namespace tutti::detail
