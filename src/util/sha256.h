// SHA-256 (FIPS 180-4), for the TCP store's challenge-response on a shared secret (internal).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tutti::detail {

std::array<uint8_t, 32> sha256(const std::string& data);

// HMAC-SHA-256 (RFC 2104).
std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message);

}  // namespace tutti::detail
