// Opt-in TLS (TLS 1.3, a key derived from the shared secret): the TCP store with it works as
// without, carries nothing in the clear, and a client that does not match its server (TLS on one
// side only, another secret) fails with a named error, never a hang.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "test_util.h"
#include "tutti/tcp_store.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// A TCP relay on a loopback port to `target`, keeping every byte that passes either way: what an
// eavesdropper on the network would see.
class RecordingRelay {
 public:
  explicit RecordingRelay(uint16_t target) : target_(target) {
    listener_ = listen_loopback(port_);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingRelay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  std::string seen() {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }

 private:
  void run() {
    std::vector<std::pair<int, int>> pairs;  // (client, server)
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (auto& [c, s] : pairs) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({s, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int c = ::accept(listener_, nullptr, nullptr);
        const int s = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(target_);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
        pairs.emplace_back(c, s);
      }
      const size_t polled = (fds.size() - 1) / 2;  // a pair accepted just now was not polled
      for (size_t i = 0; i < polled; ++i) {
        for (int side = 0; side < 2; ++side) {
          if (!(fds[1 + 2 * i + side].revents & (POLLIN | POLLHUP))) continue;
          const int from = side == 0 ? pairs[i].first : pairs[i].second;
          const int to = side == 0 ? pairs[i].second : pairs[i].first;
          char buf[65536];
          const ssize_t n = ::read(from, buf, sizeof(buf));
          if (n <= 0) {
            ::shutdown(to, SHUT_WR);
            continue;
          }
          {
            std::lock_guard<std::mutex> lock(mutex_);
            seen_.append(buf, static_cast<size_t>(n));
          }
          (void)!::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
        }
      }
    }
    for (auto& [c, s] : pairs) {
      ::close(c);
      ::close(s);
    }
  }

  uint16_t target_;
  uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::string seen_;
};

TCPStoreServerOptions server_options(bool tls, const std::string& secret = "s3cret") {
  TCPStoreServerOptions o;
  o.secret = secret;
  o.tls = tls;
  return o;
}

TCPStoreOptions client_options(bool tls, const std::string& secret = "s3cret",
                               milliseconds timeout = milliseconds(5000)) {
  TCPStoreOptions o;
  o.secret = secret;
  o.tls = tls;
  o.timeout = timeout;
  return o;
}

// Through a relay: every op works, and with TLS nothing of the keys or values is on the wire
// (without it, the same relay sees them: the check can fail).
TEST(StoreTls, EveryOpWorksAndNothingTravelsInTheClear) {
  for (bool tls : {false, true}) {
    TCPStoreServer server("127.0.0.1", 0, server_options(tls));
    RecordingRelay relay(server.port());
    TCPStore store("127.0.0.1", relay.port(), client_options(tls));
    store.set("the-key-on-the-wire", "the-value-on-the-wire");
    EXPECT_EQ(store.get("the-key-on-the-wire"), "the-value-on-the-wire");
    EXPECT_EQ(store.add("counter-on-the-wire", 5), 5);
    EXPECT_EQ(store.compare_set("the-key-on-the-wire", "the-value-on-the-wire", "next"), "next");
    std::thread later([&] {
      TCPStore other("127.0.0.1", relay.port(), client_options(tls));
      std::this_thread::sleep_for(milliseconds(50));
      other.set("waited-for", std::string(1 << 20, 'x'));  // a 1 MiB value
    });
    store.wait({"waited-for"}, milliseconds(5000));
    EXPECT_EQ(store.get("waited-for").size(), size_t{1} << 20);
    later.join();
    const std::string wire = relay.seen();
    const bool clear = wire.find("the-value-on-the-wire") != std::string::npos ||
                       wire.find("the-key-on-the-wire") != std::string::npos ||
                       wire.find("xxxxxxxxxxxxxxxx") != std::string::npos;
    EXPECT_EQ(clear, !tls) << (tls ? "TLS left bytes in the clear" : "the relay saw nothing");
  }
}

TEST(StoreTls, MismatchedClientsFailNamingWhy) {
  TCPStoreServer tls_server("127.0.0.1", 0, server_options(true));
  TCPStoreServer plain_server("127.0.0.1", 0, server_options(false));
  // TLS to a plain server; another secret: refused at once, saying why.
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", plain_server.port(), client_options(true)).set("k", "v"),
                     ErrorCode::kInvalidArgument, "the TLS handshake failed", "may not use TLS");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TUTTI_ERROR(
      TCPStore("127.0.0.1", tls_server.port(), client_options(true, "other")).set("k", "v"),
      ErrorCode::kInvalidArgument, "the TLS handshake failed", "secret differs");
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  // A plain client waits for a hello a TLS server never sends in the clear: it fails at its
  // timeout, not later.
  EXPECT_TUTTI_ERROR(
      TCPStore("127.0.0.1", tls_server.port(), client_options(false, "s3cret", milliseconds(500)))
          .set("k", "v"),
      ErrorCode::kTimeout, "could not connect");
  // TLS without a secret is refused before any I/O.
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", tls_server.port(), client_options(true, "")),
                     ErrorCode::kInvalidArgument, "TLS needs a secret");
  EXPECT_TUTTI_ERROR(TCPStoreServer("127.0.0.1", 0, server_options(true, "")),
                     ErrorCode::kInvalidArgument, "TLS needs a secret");
  // The server is unharmed: a good client works.
  TCPStore good("127.0.0.1", tls_server.port(), client_options(true));
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

// A self-signed certificate and its key, made here (nobody's trusted certificate).
std::pair<EVP_PKEY*, X509*> self_signed() {
  EVP_PKEY* key = EVP_RSA_gen(2048);
  X509* cert = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("not-the-store"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  return {key, cert};
}

// Someone without the secret poses as a TLS store, with a certificate instead of the key (TLS
// 1.3 lets a server answer so): the client refuses it, it learns nothing.
TEST(StoreTls, AServerWithACertificateInsteadOfTheKeyIsRefused) {
  auto [key, cert] = self_signed();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  ASSERT_EQ(SSL_CTX_use_certificate(ctx, cert), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey(ctx, key), 1);
  uint16_t port = 0;
  const int listener = listen_loopback(port);
  std::atomic<bool> got_secret_bytes{false};
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      char buf[256];
      got_secret_bytes = SSL_read(ssl, buf, sizeof(buf)) > 0;  // would be the client's hello
    }
    SSL_free(ssl);
    ::close(fd);
  });
  EXPECT_TUTTI_ERROR(TCPStore("127.0.0.1", port, client_options(true)).set("k", "v"),
                     ErrorCode::kInvalidArgument, "the TLS handshake failed");
  impostor.join();
  EXPECT_FALSE(got_secret_bytes.load());
  ::close(listener);
  SSL_CTX_free(ctx);
  X509_free(cert);
  EVP_PKEY_free(key);
}

TEST(StoreTls, UrlsAndTheEnvironmentTurnItOn) {
  TCPStoreServer server("127.0.0.1", 0, server_options(true));
  const std::string url = "tcp://127.0.0.1:" + std::to_string(server.port()) + "?secret=s3cret";
  open_store(url + "&tls=1", milliseconds(5000))->set("a", "1");
  ::setenv("TUTTI_STORE_TLS", "1", 1);
  EXPECT_EQ(open_store(url, milliseconds(5000))->get("a"), "1");
  ::setenv("TUTTI_STORE_TLS", "maybe", 1);
  EXPECT_TUTTI_ERROR(open_store(url), ErrorCode::kInvalidArgument,
                     "TUTTI_STORE_TLS must be 1 or 0");
  ::unsetenv("TUTTI_STORE_TLS");
  EXPECT_TUTTI_ERROR(open_store(url + "&tls=yes"), ErrorCode::kInvalidArgument,
                     "tls must be 0 or 1, not 'yes'");
}

// A group meets and runs through a TLS store rank 0 hosts (the URL carries tls=1).
TEST(StoreTls, AGroupMeetsThroughIt) {
  const uint16_t port = free_port();
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port) + "?secret=s3cret&tls=1";
  const std::string name = unique_name("tls-group");
  std::vector<std::shared_ptr<CollectiveGroup>> groups(2);
  run_ranks(2, [&](int r) {
    GroupOptions o;
    o.store_url = url;
    o.timeout = milliseconds(20000);
    groups[r] = CollectiveGroup::create(2, r, "gloo", name, o);
    std::vector<int32_t> v(16, r + 1);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[0], 3);
  });
  for (auto& g : groups) g->destroy();
}

}  // namespace
}  // namespace tutti::testing
