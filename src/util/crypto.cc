#include "util/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "tutti/error.h"

namespace tutti::detail {

namespace {

// OpenSSL initialised when libtutti loads, before anything of tutti's can call it, without its
// exit-time teardown. tutti's threads may outlive main (a hosted TCP store lingers for its
// clients, over TLS too), and that teardown frees OpenSSL's global locks under them: tutti asks
// OpenSSL not to register it (OPENSSL_INIT_NO_ATEXIT, 1.1.1b and later; the kernel reclaims the
// memory at exit). Where the program initialised OpenSSL before libtutti loaded, its choice
// stands. A failure here shows as the failure of the call that follows (each checks its own).
#ifdef OPENSSL_INIT_NO_ATEXIT
[[maybe_unused]] const bool kOpenSslInitialised =
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
#endif

}  // namespace

std::array<uint8_t, 32> sha256(const std::string& data) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != out.size()) {
    throw Error(ErrorCode::kInternal, "libcrypto's SHA-256 failed");
  }
  return out;
}

std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  // HMAC() takes the key's length as an int.
  if (key.size() > static_cast<size_t>(INT32_MAX) ||
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    throw Error(ErrorCode::kInternal, "libcrypto's HMAC-SHA-256 failed");
  }
  return out;
}

bool same_secret(const void* a, size_t a_size, const void* b, size_t b_size) {
  // The lengths are not secret (a proof has a fixed size); the bytes are.
  if (a_size != b_size) return false;
  return a_size == 0 || CRYPTO_memcmp(a, b, a_size) == 0;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t have = 0;
  while (have < n) {
    const ssize_t got = ::getrandom(&out[have], n - have, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInternal, std::string("getrandom failed: ") + std::strerror(errno));
    }
    have += static_cast<size_t>(got);
  }
  return out;
}

}  // namespace tutti::detail
