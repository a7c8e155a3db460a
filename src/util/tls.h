// TLS 1.3 with a pre-shared key (internal): what the TCP store's connections and the direct
// transport's socket connections use when TLS is asked for. The key is derived from the secret
// the two sides already share (the store's or the agents'), so TLS needs no certificates and no
// setup beyond that secret. OpenSSL's libssl; no session tickets (nothing arrives after the
// handshake but the peer's own records).
#pragma once

#include <openssl/ssl.h>

#include <memory>
#include <string>

namespace tutti::detail {

// An SSL_CTX for one side (`server` or client) whose only key is derived from `secret` under
// `label` (e.g. "tutti store"). Throws Error(kInvalidArgument) for an empty secret,
// kInternal when OpenSSL fails.
std::shared_ptr<SSL_CTX> make_psk_context(bool server, const std::string& secret,
                                          const std::string& label);

// A BIO over a connected socket whose writes never raise SIGPIPE (send with MSG_NOSIGNAL; a
// peer gone is an error, not a signal), for SSL_set_bio. Does not own the descriptor.
BIO* socket_bio(int fd);

// Whether a finished handshake was TLS 1.3 authenticated by the pre-shared key (a resumed
// session, in OpenSSL's terms) and not by a certificate.
bool used_the_key(SSL* ssl);

// OpenSSL's last error queue as one line (emptied), for messages.
std::string tls_error_text();

// Whether TUTTI_<what>_TLS asks for TLS ("1", "true", "yes", "on"; "0", "false", "no", "off" or
// unset do not; anything else is Error(kInvalidArgument) naming the variable).
bool tls_from_env(const char* variable);

}  // namespace tutti::detail
