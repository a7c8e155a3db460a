// tutti-store: serves the TCP store protocol on its own, for jobs that want the store outside
// any rank (a long-lived service, a login node).
//
//   tutti-store --host 0.0.0.0 --port 29500        # TUTTI_STORE_SECRET=... to require a secret
//
// Prints "tutti-store listening on HOST:PORT" (the bound port when --port 0) and serves until
// SIGINT or SIGTERM. Raises its own soft limit on open files to the hard limit: each client
// holds a descriptor.
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tutti/error.h"
#include "tutti/tcp_store.h"
#include "tutti/version.h"

namespace {
constexpr const char* kUsage =
    R"(usage: tutti-store [--host HOST] [--port PORT] [--max-connections N] [--idle-timeout SECONDS]
                   [--tls]

Serves a tutti TCP store until SIGINT or SIGTERM.
  --host HOST             address to bind (default 127.0.0.1; 0.0.0.0 for every interface)
  --port PORT             port (default 29500; 0 picks a free one, printed at start)
  --max-connections N     clients served at once (default 4096); more are turned away and retry
  --idle-timeout SECONDS  close a client's connection after this long without a request
                          (default 600; 0: never); clients blocked in a wait are not idle
  --tls                   every connection in TLS 1.3 keyed by the secret (needs one; also
                          TUTTI_STORE_TLS=1); its clients need TUTTI_STORE_TLS=1 too
A secret in TUTTI_STORE_SECRET must then be proven by every client.
)";

// Parses a whole decimal number in [min, max]; false otherwise.
bool parse_number(const char* text, long long min, long long max, long long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(text, &end, 10);
  return *text != '\0' && *end == '\0' && errno == 0 && out >= min && out <= max;
}
}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  long long port = 29500;
  tutti::TCPStoreServerOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--tls") {
      options.tls = true;
      continue;
    }
    if (a == "--version") {
      std::printf("tutti-store %s\n", tutti::version());
      return 0;
    }
    const bool takes_value =
        a == "--host" || a == "--port" || a == "--max-connections" || a == "--idle-timeout";
    if (takes_value && i + 1 < argc) {
      const char* v = argv[++i];
      long long n = 0;
      if (a == "--host") {
        host = v;
      } else if (a == "--port") {
        if (!parse_number(v, 0, 65535, port)) {
          std::fprintf(stderr, "tutti-store: --port needs a port in [0, 65535], got '%s'\n", v);
          return 2;
        }
      } else if (a == "--max-connections") {
        if (!parse_number(v, 1, 1 << 24, n)) {
          std::fprintf(stderr, "tutti-store: --max-connections needs a positive number, got '%s'\n",
                       v);
          return 2;
        }
        options.max_connections = static_cast<size_t>(n);
      } else {
        if (!parse_number(v, 0, 365LL * 24 * 3600, n)) {
          std::fprintf(stderr, "tutti-store: --idle-timeout needs seconds (0: never), got '%s'\n",
                       v);
          return 2;
        }
        options.idle_timeout = std::chrono::seconds(n);
      }
      continue;
    }
    std::fprintf(stderr, "tutti-store: unknown argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  // Every client holds a descriptor: allow as many as the hard limit lets this process.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before the server's thread starts
  try {
    if (const char* secret = std::getenv("TUTTI_STORE_SECRET")) options.secret = secret;
    if (const char* tls = std::getenv("TUTTI_STORE_TLS")) {
      const std::string t = tls;
      if (t != "" && t != "0" && t != "1") {
        std::fprintf(stderr, "tutti-store: TUTTI_STORE_TLS must be 1 or 0, not '%s'\n", tls);
        return 2;
      }
      options.tls = options.tls || t == "1";
    }
    tutti::TCPStoreServer server(host, static_cast<uint16_t>(port), options);
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
