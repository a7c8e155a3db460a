// tutti-store: serves the TCP store protocol on its own, for jobs that want the store outside
// any rank (a long-lived service, a login node).
//
//   tutti-store --host 0.0.0.0 --port 29500        # TUTTI_STORE_SECRET=... to require a secret
//
// Prints "tutti-store listening on HOST:PORT" (the bound port when --port 0) and serves until
// SIGINT or SIGTERM.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tutti/error.h"
#include "tutti/tcp_store.h"
#include "tutti/version.h"

namespace {
constexpr const char* kUsage = R"(usage: tutti-store [--host HOST] [--port PORT]

Serves a tutti TCP store until SIGINT or SIGTERM.
  --host HOST   address to bind (default 127.0.0.1; 0.0.0.0 for every interface)
  --port PORT   port (default 29500; 0 picks a free one, printed at start)
A secret in TUTTI_STORE_SECRET must then be proven by every client.
)";
}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  long port = 29500;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--version") {
      std::printf("tutti-store %s\n", tutti::version());
      return 0;
    }
    if ((a == "--host" || a == "--port") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--host") {
        host = v;
      } else {
        char* end = nullptr;
        port = std::strtol(v, &end, 10);
        if (*v == '\0' || *end != '\0' || port < 0 || port > 65535) {
          std::fprintf(stderr, "tutti-store: --port needs a port in [0, 65535], got '%s'\n", v);
          return 2;
        }
      }
      continue;
    }
    std::fprintf(stderr, "tutti-store: unknown argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before the server's thread starts
  try {
    const char* secret = std::getenv("TUTTI_STORE_SECRET");
    tutti::TCPStoreServer server(host, static_cast<uint16_t>(port), secret ? secret : "");
    std::printf("tutti-store listening on %s:%u\n", host.c_str(), server.port());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&signals, &sig);
    std::printf("tutti-store: signal %d, stopping\n", sig);
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "tutti-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
