#include "util/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tutti/error.h"
#include "util/crypto.h"

namespace tutti::detail {
namespace {

// The key and identity a context's callbacks hand OpenSSL (its app data).
struct PskKey {
  std::string identity;
  std::string key;  // 32 bytes
};

int key_slot() {
  static const int slot = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<PskKey*>(ptr);
      });
  return slot;
}

const PskKey* key_of(SSL* ssl) {
  return static_cast<const PskKey*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), key_slot()));
}

unsigned int client_psk(SSL* ssl, const char* /*hint*/, char* identity, unsigned int max_identity,
                        unsigned char* psk, unsigned int max_psk) {
  const PskKey* k = key_of(ssl);
  if (k == nullptr || k->identity.size() + 1 > max_identity || k->key.size() > max_psk) return 0;
  std::memcpy(identity, k->identity.c_str(), k->identity.size() + 1);
  std::memcpy(psk, k->key.data(), k->key.size());
  return static_cast<unsigned int>(k->key.size());
}

unsigned int server_psk(SSL* ssl, const char* identity, unsigned char* psk, unsigned int max_psk) {
  const PskKey* k = key_of(ssl);
  if (k == nullptr || identity == nullptr || k->identity != identity || k->key.size() > max_psk) {
    return 0;  // an unknown identity: the handshake fails
  }
  std::memcpy(psk, k->key.data(), k->key.size());
  return static_cast<unsigned int>(k->key.size());
}

int bio_write(BIO* b, const char* data, int n) {
  const ssize_t rc = ::send(BIO_get_fd(b, nullptr), data, static_cast<size_t>(n), MSG_NOSIGNAL);
  BIO_clear_retry_flags(b);
  if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(b);
  }
  return static_cast<int>(rc);
}

int bio_read(BIO* b, char* data, int n) {
  const ssize_t rc = ::recv(BIO_get_fd(b, nullptr), data, static_cast<size_t>(n), 0);
  BIO_clear_retry_flags(b);
  if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(b);
  }
  return static_cast<int>(rc);
}

// The socket BIO's own control calls (descriptor, flush...), with our read and write.
const BIO_METHOD* nosigpipe_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "tutti socket");
    const BIO_METHOD* base = BIO_s_socket();
    BIO_meth_set_write(m, bio_write);
    BIO_meth_set_read(m, bio_read);
    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(base));
    BIO_meth_set_create(m, BIO_meth_get_create(base));
    BIO_meth_set_destroy(m, BIO_meth_get_destroy(base));
    return m;
  }();
  return method;
}

}  // namespace

BIO* socket_bio(int fd) {
  BIO* b = BIO_new(nosigpipe_method());
  if (b != nullptr) BIO_set_fd(b, fd, BIO_NOCLOSE);
  return b;
}

std::string tls_error_text() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

std::shared_ptr<SSL_CTX> make_psk_context(bool server, const std::string& secret,
                                          const std::string& label) {
  if (secret.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                label + ": TLS needs a secret (its key is derived from it): set one");
  }
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()),
                               SSL_CTX_free);
  if (!ctx) throw Error(ErrorCode::kInternal, label + ": SSL_CTX_new: " + tls_error_text());
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(ctx.get(), "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256") !=
          1) {
    throw Error(ErrorCode::kInternal, label + ": TLS 1.3 setup: " + tls_error_text());
  }
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  const auto mac = hmac_sha256(secret, "tutti tls psk 1 " + label);
  auto* key = new PskKey{label, std::string(reinterpret_cast<const char*>(mac.data()), mac.size())};
  if (SSL_CTX_set_ex_data(ctx.get(), key_slot(), key) != 1) {
    delete key;
    throw Error(ErrorCode::kInternal, label + ": SSL_CTX_set_ex_data: " + tls_error_text());
  }
  if (server) {
    SSL_CTX_set_psk_server_callback(ctx.get(), server_psk);
  } else {
    SSL_CTX_set_psk_client_callback(ctx.get(), client_psk);
    // A server may answer with a certificate instead of the key (TLS 1.3 allows it): nothing
    // here trusts one, so anyone's certificate is refused, and only the key can authenticate.
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, [](int, X509_STORE_CTX*) { return 0; });
  }
  return ctx;
}

bool used_the_key(SSL* ssl) {
  if (ssl == nullptr || SSL_session_reused(ssl) != 1 || SSL_version(ssl) != TLS1_3_VERSION) {
    return false;
  }
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  return SSL_get0_peer_certificate(ssl) == nullptr;
#else
  X509* cert = SSL_get_peer_certificate(ssl);
  X509_free(cert);
  return cert == nullptr;
#endif
}

bool tls_from_env(const char* variable) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return false;
  const std::string s(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw Error(
      ErrorCode::kInvalidArgument,
      std::string(variable) + " must be 1 or 0 (true/false, yes/no, on/off), not '" + s + "'");
}

}  // namespace tutti::detail
