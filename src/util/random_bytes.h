// Bytes from the system's random source (std::random_device: getrandom on Linux), for nonces and
// ids (internal).
#pragma once

#include <cstddef>
#include <random>
#include <string>

namespace tutti::detail {

inline std::string random_bytes(size_t n) {
  std::random_device rd;
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rd() & 0xff);
  return out;
}

}  // namespace tutti::detail
