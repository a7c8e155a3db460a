#include "util/crypto.h"

// SHA-256's own functions (SHA256_Init and the rest, deprecated since OpenSSL 3.0 but built in
// every release of it): a keyed state is a plain struct, copied for nothing, where an EVP
// digest context's copy costs ~0.6 us (below).
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>

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
// (3 us in a loop with its caches flushed). A state is SHA-256's own context where OpenSSL still
// has its functions (a struct copy; a MAC of a ref 0.3 us), else an EVP digest context (two
// copies 1.1-1.3 us a MAC). The keys are few (an agent's secret, a store's): the first kKeptKeys
// are kept keyed for the process's life (like OpenSSL itself, never torn down: see
// kOpenSslInitialised), others take the one-shot call.
constexpr size_t kKeptKeys = 8;
constexpr size_t kBlock = 64;  // SHA-256's block

#ifndef OPENSSL_NO_DEPRECATED_3_0
class Sha256State {
 public:
  bool init() { return SHA256_Init(&c_) == 1; }
  bool update(const void* data, size_t n) { return SHA256_Update(&c_, data, n) == 1; }
  bool final(unsigned char* out) { return SHA256_Final(out, &c_) == 1; }
  bool copy_from(const Sha256State& other) {
    c_ = other.c_;
    return true;
  }
  ~Sha256State() { OPENSSL_cleanse(&c_, sizeof(c_)); }

 private:
  SHA256_CTX c_{};
};
#else
class Sha256State {
 public:
  bool init() { return c_ && EVP_DigestInit_ex(c_.get(), EVP_sha256(), nullptr) == 1; }
  bool update(const void* data, size_t n) { return EVP_DigestUpdate(c_.get(), data, n) == 1; }
  bool final(unsigned char* out) {
    unsigned int len = 0;
    return EVP_DigestFinal_ex(c_.get(), out, &len) == 1 && len == 32;
  }
  bool copy_from(const Sha256State& other) {
    return c_ && EVP_MD_CTX_copy_ex(c_.get(), other.c_.get()) == 1;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> c_{EVP_MD_CTX_new()};
};
#endif

struct KeyedMac {
  std::string key;
  Sha256State inner;
  Sha256State outer;
};

std::mutex& keyed_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
// Kept in place (a list): a state is not moved once keyed.
std::list<KeyedMac>& keyed() {
  static auto* v = new std::list<KeyedMac>;
  return *v;
}

// Whether `state` absorbed the key's block XOR `pad`.
bool padded(Sha256State& state, const unsigned char* block, unsigned char pad) {
  unsigned char b[kBlock];
  for (size_t i = 0; i < kBlock; ++i) b[i] = block[i] ^ pad;
  const bool ok = state.init() && state.update(b, kBlock);
  OPENSSL_cleanse(b, kBlock);
  return ok;
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
  std::list<KeyedMac> made(1);
  made.front().key = key;
  const bool ok =
      padded(made.front().inner, block, 0x36) && padded(made.front().outer, block, 0x5c);
  OPENSSL_cleanse(block, kBlock);
  if (!ok) return nullptr;
  keyed().splice(keyed().end(), made);
  return &keyed().back();
}

}  // namespace

std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message) {
  Sha256State inner;
  Sha256State outer;
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(keyed_mutex());
    if (const KeyedMac* k = keyed_locked(key)) {
      kept = inner.copy_from(k->inner) && outer.copy_from(k->outer);
    }
  }
  if (!kept) return one_shot_hmac(key, message);
  std::array<uint8_t, 32> out{};
  unsigned char digest[32];
  const bool ok = inner.update(message.data(), message.size()) && inner.final(digest) &&
                  outer.update(digest, sizeof(digest)) && outer.final(out.data());
  OPENSSL_cleanse(digest, sizeof(digest));
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
