// The TCP store server's protocol: what a client sends it (src/store/tcp_store_protocol.h).
//
// Two servers for the whole run, one without a secret and one with; each input is one connection.
// The first byte picks what the rest is: the client's handshake and everything after it, raw;
// or, after a proper handshake (to the server without a secret, or with a wrong proof to the one
// with), a series of requests, each a length-prefixed body made from the input
// (FuzzedDataProvider). The servers must answer or close the connection, never crash, and keep
// serving: every so often a fresh client must still be able to set and get a key.
#include <arpa/inet.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_socket.h"
#include "store/tcp_store_protocol.h"
#include "tutti/tcp_store.h"

namespace {

namespace proto = tutti::detail::tcp_store;
const char kSecret[] = "fuzz-secret";

tutti::TCPStoreServer& server(bool with_secret) {
  auto make = [](const char* secret) {
    tutti::TCPStoreServerOptions o;
    o.secret = secret;
    o.idle_timeout = std::chrono::seconds(2);
    o.max_message_bytes = 1 << 20;
    o.max_buffered_bytes = 8 << 20;
    return new tutti::TCPStoreServer("127.0.0.1", 0, o);
  };
  static auto* plain = make("");
  static auto* secret = make(kSecret);
  return with_secret ? *secret : *plain;
}

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  tutti_fuzz::connect_or_die(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

bool read_some(int fd, std::string& into, size_t want, int timeout_ms) {
  while (into.size() < want) {
    if (tutti_fuzz::poll_one(fd, POLLIN, timeout_ms) != 1) return false;
    char buf[4096];
    const ssize_t n = tutti_fuzz::recv_some(fd, buf, sizeof(buf));
    if (n <= 0) return false;
    into.append(buf, static_cast<size_t>(n));
  }
  return true;
}

using tutti_fuzz::send_all;  // stops when the server closed the connection: fine

// Reads what the server says until it closes the connection or falls silent.
void drain(int fd) {
  std::string sink;
  while (read_some(fd, sink, sink.size() + 1, 100)) {
    if (sink.size() > (1 << 20)) sink.clear();
  }
}

// The client's handshake answer to the server's hello: zeros (no secret) or a wrong proof.
std::string client_hello(bool zeros) {
  const std::string proof(proto::kProofBytes, zeros ? '\0' : 'x');
  proto::Writer w;
  w.u32(proto::kMagic).u16(proto::kVersion).raw(proof.data(), proof.size());
  return w.body();
}

// A client that does what TCPStore does: the server must still serve one after any input.
void check_still_serving(bool with_secret) {
  tutti::TCPStoreOptions o;
  o.timeout = std::chrono::seconds(10);
  o.secret = with_secret ? kSecret : "";
  tutti::TCPStore store("127.0.0.1", server(with_secret).port(), o);
  store.set("fuzz/alive", "yes");
  if (store.get("fuzz/alive") != "yes") std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;  // 0, 1: raw to either; 2: no secret; 3: a wrong proof
  const bool with_secret = mode == 1 || mode == 3;
  const int fd = connect_to(server(with_secret).port());
  std::string hello;
  if (!read_some(fd, hello, proto::kServerHelloBytes, 5000)) std::abort();  // the server's hello
  FuzzedDataProvider in(data + 1, size - 1);
  if (mode <= 1) {
    send_all(fd, in.ConsumeRemainingBytesAsString());
  } else {
    send_all(fd, client_hello(mode == 2));
    std::string status;
    read_some(fd, status, 1, 2000);
    while (in.remaining_bytes() > 0) {
      const std::string body = in.ConsumeRandomLengthString(4096);
      std::string frame(4, '\0');
      const uint32_t n = static_cast<uint32_t>(body.size());
      std::memcpy(frame.data(), &n, 4);
      send_all(fd, frame + body);
    }
  }
  ::shutdown(fd, SHUT_WR);
  drain(fd);
  ::close(fd);
  static int count = 0;
  if (++count % 64 == 0) check_still_serving(with_secret);
  return 0;
}
