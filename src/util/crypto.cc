#include "util/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

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

namespace {

std::array<uint8_t, 32> one_shot_hmac(const std::string& key, const std::string& message) {
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

#if OPENSSL_VERSION_NUMBER >= 0x30000000L
// OpenSSL 3's HMAC() fetches its algorithms from the provider store on every call: 15 us per
// signed ref in the direct transport's get, cold after a transfer had the cache (measured), where
// a copy of a context keyed once costs 1-2 us. The keys are few (an agent's secret, a store's):
// the first kKeptKeys are kept keyed for the process's life (like OpenSSL itself, never torn
// down: see kOpenSslInitialised), others take the one-shot call.
constexpr size_t kKeptKeys = 8;

struct KeyedMac {
  std::string key;
  EVP_MAC_CTX* ctx = nullptr;
};

std::mutex& keyed_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<KeyedMac>& keyed() {
  static auto* v = new std::vector<KeyedMac>;
  return *v;
}

// A keyed context of its own for this call (freed by the caller), or null where none is kept.
EVP_MAC_CTX* keyed_copy(const std::string& key) {
  std::lock_guard<std::mutex> lock(keyed_mutex());
  for (const KeyedMac& k : keyed()) {
    if (k.key == key) return EVP_MAC_CTX_dup(k.ctx);
  }
  if (keyed().size() >= kKeptKeys) return nullptr;
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) return nullptr;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);  // the context holds its own reference
  if (ctx == nullptr) return nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) !=
      1) {
    EVP_MAC_CTX_free(ctx);
    return nullptr;
  }
  keyed().push_back({key, ctx});
  return EVP_MAC_CTX_dup(ctx);
}
#endif

}  // namespace

std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  if (EVP_MAC_CTX* ctx = keyed_copy(key)) {
    std::array<uint8_t, 32> out{};
    size_t len = 0;
    const bool ok = EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(message.data()),
                                   message.size()) == 1 &&
                    EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == out.size();
    EVP_MAC_CTX_free(ctx);
    if (!ok) throw Error(ErrorCode::kInternal, "libcrypto's HMAC-SHA-256 failed");
    return out;
  }
#endif
  return one_shot_hmac(key, message);
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
