// The cryptography the store and the direct transport use (internal): SHA-256 and HMAC-SHA-256
// from OpenSSL's libcrypto, a comparison of secrets that takes the same time wherever they
// differ, and bytes from the kernel's random source (getrandom) for nonces and ids.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti::detail {

std::array<uint8_t, 32> sha256(const std::string& data);

// HMAC-SHA-256 (RFC 2104) of `message` under `key`.
std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message);

// Whether a and b hold the same bytes, in time that depends on their length only (a proof
// compared with == tells a prober how many of its leading bytes were right).
bool same_secret(const void* a, size_t a_size, const void* b, size_t b_size);
inline bool same_secret(const std::string& a, const std::string& b) {
  return same_secret(a.data(), a.size(), b.data(), b.size());
}

// n bytes from getrandom(2), which blocks only until the kernel's pool is first seeded. Throws
// tutti::Error (kInternal) if the kernel refuses.
std::string random_bytes(size_t n);

}  // namespace tutti::detail
