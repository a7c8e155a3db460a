// Small helpers shared by the core's group code (internal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tutti::detail {

// Percent-encodes every byte outside [A-Za-z0-9._-], so any group name is safe inside a store
// key, a file name or a shared-memory segment name ("a/b" -> "a%2Fb").
std::string escape_name(std::string_view name);

// 64-bit FNV-1a, for deriving op tags; mix() folds more values in.
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

}  // namespace tutti::detail
