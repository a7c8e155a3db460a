#include "util/crypto.h"

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

// HMAC (RFC 2104) from two SHA-256 states keyed once per key: the inner one has absorbed the key
// XOR ipad, the outer one the key XOR opad; a MAC continues copies of both. OpenSSL 3's HMAC()
// fetches its algorithms from the provider store on every call (15 us per signed ref in the
// direct transport's get, measured), and even a copy of a keyed EVP_MAC context took 8 us there
// (3 us in a loop with its caches flushed), two digest copies 1.1-1.3 us. The keys are few (an
// agent's secret, a store's): the first kKeptKeys are kept keyed for the process's life (like
// OpenSSL itself, never torn down: see kOpenSslInitialised), others take the one-shot call.
constexpr size_t kKeptKeys = 8;
constexpr size_t kBlock = 64;  // SHA-256's block

struct KeyedMac {
  std::string key;
  EVP_MD_CTX* inner = nullptr;
  EVP_MD_CTX* outer = nullptr;
};

std::mutex& keyed_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<KeyedMac>& keyed() {
  static auto* v = new std::vector<KeyedMac>;
  return *v;
}

// A digest context that has absorbed the key's block XOR `pad`; null on failure.
EVP_MD_CTX* padded(const unsigned char* block, unsigned char pad) {
  unsigned char b[kBlock];
  for (size_t i = 0; i < kBlock; ++i) b[i] = block[i] ^ pad;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, b, kBlock) == 1;
  OPENSSL_cleanse(b, kBlock);
  if (ok) return ctx;
  EVP_MD_CTX_free(ctx);
  return nullptr;
}

// The key's kept states (made on its first use while fewer than kKeptKeys are), under the lock;
// null where none is kept.
const KeyedMac* keyed_locked(const std::string& key) {
  for (const KeyedMac& k : keyed()) {
    if (k.key == key) return &k;
  }
  if (keyed().size() >= kKeptKeys) return nullptr;
  // The key as a block: hashed first when longer than one, padded with zeros.
  unsigned char block[kBlock] = {};
  if (key.size() > kBlock) {
    unsigned int len = 0;
    if (EVP_Digest(key.data(), key.size(), block, &len, EVP_sha256(), nullptr) != 1) {
      return nullptr;
    }
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  KeyedMac k{key, padded(block, 0x36), padded(block, 0x5c)};
  OPENSSL_cleanse(block, kBlock);
  if (k.inner == nullptr || k.outer == nullptr) {
    EVP_MD_CTX_free(k.inner);
    EVP_MD_CTX_free(k.outer);
    return nullptr;
  }
  keyed().push_back(std::move(k));
  return &keyed().back();
}

}  // namespace

std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message) {
  struct Contexts {
    EVP_MD_CTX* inner = EVP_MD_CTX_new();
    EVP_MD_CTX* outer = EVP_MD_CTX_new();
    ~Contexts() {
      EVP_MD_CTX_free(inner);
      EVP_MD_CTX_free(outer);
    }
  } c;
  bool kept = false;
  if (c.inner != nullptr && c.outer != nullptr) {
    std::lock_guard<std::mutex> lock(keyed_mutex());
    if (const KeyedMac* k = keyed_locked(key)) {
      kept =
          EVP_MD_CTX_copy_ex(c.inner, k->inner) == 1 && EVP_MD_CTX_copy_ex(c.outer, k->outer) == 1;
    }
  }
  if (!kept) return one_shot_hmac(key, message);
  std::array<uint8_t, 32> out{};
  unsigned char inner[32];
  unsigned int inner_len = 0;
  unsigned int len = 0;
  const bool ok = EVP_DigestUpdate(c.inner, message.data(), message.size()) == 1 &&
                  EVP_DigestFinal_ex(c.inner, inner, &inner_len) == 1 &&
                  inner_len == sizeof(inner) &&
                  EVP_DigestUpdate(c.outer, inner, sizeof(inner)) == 1 &&
                  EVP_DigestFinal_ex(c.outer, out.data(), &len) == 1 && len == out.size();
  OPENSSL_cleanse(inner, sizeof(inner));
  if (!ok) throw Error(ErrorCode::kInternal, "libcrypto's HMAC-SHA-256 failed");
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
