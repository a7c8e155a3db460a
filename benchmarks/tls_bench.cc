// What opt-in TLS costs (util/tls.h: TLS 1.3, a key derived from the shared secret), measured
// against plain TCP in the same run, on loopback:
//   - the TCP store: a small set+get round trip, and a 16 MiB value's set;
//   - the direct transport's byte stream (what the socket transport sends an object over):
//     256 MiB in 1 MiB pieces from one connection to another.
// Medians over --reps repetitions; ratios are TLS over plain.
//
//   tutti-tls-bench [--reps N]
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transfer/channel.h"
#include "tutti/error.h"
#include "tutti/tcp_store.h"
#include "util/tls.h"

namespace {

using Clock = std::chrono::steady_clock;
using tutti::detail::Connection;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

struct StoreFigures {
  double round_trip_us = 0;  // one set and one get of 64 bytes
  double big_set_ms = 0;     // one set of 16 MiB
};

StoreFigures store_figures(bool tls, int reps) {
  tutti::TCPStoreServerOptions so;
  so.secret = "bench-secret";
  so.tls = tls;
  tutti::TCPStoreServer server("127.0.0.1", 0, so);
  tutti::TCPStoreOptions co;
  co.secret = "bench-secret";
  co.tls = tls;
  tutti::TCPStore store("127.0.0.1", server.port(), co);
  const std::string small(64, 's');
  const std::string big(16 << 20, 'b');
  for (int i = 0; i < 200; ++i) store.set("warm", small);
  std::vector<double> rt, bs;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    for (int i = 0; i < 1000; ++i) {
      store.set("k", small);
      (void)store.get("k");
    }
    rt.push_back(us_since(t) / 1000);
    const auto b = Clock::now();
    store.set("big", big);
    bs.push_back(us_since(b) / 1000);
  }
  return {median(rt), median(bs)};
}

// A connected TCP pair on loopback, in TLS when asked (the first is the accepting side).
std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> tcp_pair(bool tls) {
  uint16_t port = 0;
  const int listener = tutti::detail::listen_tcp("127.0.0.1", port);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::unique_ptr<Connection> server;
  std::thread accepting([&] {
    pollfd p{listener, POLLIN, 0};
    ::poll(&p, 1, 10000);
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    server = std::make_unique<Connection>(fd, "the bench's server side");
    if (tls) {
      static const auto ctx = tutti::detail::make_psk_context(true, "bench-secret", "bench");
      server->start_tls(ctx.get(), true, deadline);
    }
  });
  auto client = std::make_unique<Connection>(
      tutti::detail::connect_tcp("127.0.0.1", port, deadline), "the bench's client side");
  if (tls) {
    static const auto ctx = tutti::detail::make_psk_context(false, "bench-secret", "bench");
    client->start_tls(ctx.get(), false, deadline);
  }
  accepting.join();
  ::close(listener);
  return {std::move(server), std::move(client)};
}

double stream_gbps(bool tls, int reps) {
  auto [server, client] = tcp_pair(tls);
  constexpr size_t kTotal = size_t{256} << 20;
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<char> out(kPiece, 'x'), in(kPiece);
  std::vector<double> gbps;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    const auto t = Clock::now();
    std::thread receiver([&, c = server.get()] {
      for (size_t got = 0; got < kTotal; got += kPiece) c->receive_raw(in.data(), kPiece, deadline);
    });
    for (size_t sent = 0; sent < kTotal; sent += kPiece) {
      client->send_raw({{out.data(), kPiece}}, deadline);
    }
    receiver.join();
    if (r > 0) gbps.push_back(static_cast<double>(kTotal) / (us_since(t) * 1e3));
  }
  if (in[kPiece - 1] != 'x') throw tutti::Error(tutti::ErrorCode::kInternal, "stream: wrong bytes");
  return median(gbps);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: tutti-tls-bench [--reps N]\n");
      return 2;
    }
  }
  try {
    // Interleaved: plain, TLS, plain, TLS... each figure a median over its reps.
    const StoreFigures plain_store = store_figures(false, reps);
    const StoreFigures tls_store = store_figures(true, reps);
    const double plain_stream = stream_gbps(false, reps);
    const double tls_stream = stream_gbps(true, reps);
    std::printf(
        "# tutti-tls-bench: TLS 1.3 (PSK from the secret) against plain TCP, loopback, "
        "median of %d\n",
        reps);
    std::printf("%-42s %12s %12s %8s\n", "", "plain", "TLS", "TLS/plain");
    std::printf("%-42s %10.1f us %10.1f us %8.2f\n", "TCP store: set + get of 64 B",
                plain_store.round_trip_us, tls_store.round_trip_us,
                tls_store.round_trip_us / plain_store.round_trip_us);
    std::printf("%-42s %10.1f ms %10.1f ms %8.2f\n", "TCP store: set of 16 MiB",
                plain_store.big_set_ms, tls_store.big_set_ms,
                tls_store.big_set_ms / plain_store.big_set_ms);
    std::printf("%-42s %7.2f GB/s %7.2f GB/s %8.2f\n", "socket transport stream: 256 MiB",
                plain_stream, tls_stream, plain_stream / tls_stream);
    std::printf("(the last ratio is time: plain GB/s over TLS GB/s)\n");
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "tutti-tls-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
