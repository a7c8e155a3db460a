// Helpers shared by the Gloo backend and tutti-bench's raw-Gloo baseline (internal), so the
// baseline binds and types its buffers exactly as the backend does.
#pragma once

#include <gloo/transport/tcp/attr.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::gloo_backend {

// The TCP address Gloo binds: TUTTI_GLOO_IFNAME (an interface), else TUTTI_GLOO_HOSTNAME (a host
// name or address), else GLOO_SOCKET_IFNAME, else this host's name when it resolves, else
// 127.0.0.1.
inline ::gloo::transport::tcp::attr device_attr() {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return (v != nullptr && *v != '\0') ? v : nullptr;
  };
  ::gloo::transport::tcp::attr attr;
  if (const char* iface = env("TUTTI_GLOO_IFNAME")) {
    attr.iface = iface;
  } else if (const char* host = env("TUTTI_GLOO_HOSTNAME")) {
    attr.hostname = host;
  } else if (const char* gloo_iface = env("GLOO_SOCKET_IFNAME")) {
    attr.iface = gloo_iface;
  } else {
    char name[256] = {0};
    struct addrinfo* info = nullptr;
    if (::gethostname(name, sizeof(name) - 1) == 0 &&
        ::getaddrinfo(name, nullptr, nullptr, &info) == 0) {
      attr.hostname = name;
      ::freeaddrinfo(info);
    } else {
      TUTTI_LOG_WARN(
          "gloo: host name '{}' does not resolve; binding 127.0.0.1 (set "
          "TUTTI_GLOO_IFNAME or TUTTI_GLOO_HOSTNAME for multi-host groups)",
          name);
      attr.hostname = "127.0.0.1";
    }
  }
  return attr;
}

// Gloo's option setters are typed only to learn the element width; tutti passes untyped words
// of the right width (so Gloo's segments never split an element) and its own reduction.
template <typename Fn>
void with_word(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1: fn(uint8_t{}); break;
    case 2: fn(uint16_t{}); break;
    case 4: fn(uint32_t{}); break;
    case 8: fn(uint64_t{}); break;
    default:
      throw Error(ErrorCode::kInternal,
                  "gloo: unsupported element size " + std::to_string(element_size));
  }
}

}  // namespace tutti::gloo_backend
