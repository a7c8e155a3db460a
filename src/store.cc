#include "tutti/store.h"

#include <cstdlib>

#include "tutti/error.h"
#include "tutti/file_store.h"
#include "tutti/hash_store.h"
#include "tutti/redis_store.h"
#include "tutti/tcp_store.h"
#include "store_util.h"

namespace tutti {

Store::~Store() = default;

namespace detail {
int64_t parse_counter(const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::kInvalidUsage,
              "store key '" + key + "' holds '" + value + "', not a counter written by add()");
}
}  // namespace detail

namespace {

// "host:port[?secret=...]" -> parts; IPv6 hosts come in brackets: "[::1]:29500".
void parse_tcp(const std::string& url, const std::string& rest, std::string& host, uint16_t& port,
               std::string& secret) {
  std::string authority = rest;
  const auto query = rest.find('?');
  if (query != std::string::npos) {
    authority = rest.substr(0, query);
    const std::string params = rest.substr(query + 1);
    size_t pos = 0;
    while (pos <= params.size()) {
      const auto amp = params.find('&', pos);
      const std::string item = params.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (item.rfind("secret=", 0) == 0) {
        secret = item.substr(7);
      } else if (!item.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "store URL '" + url + "': unknown parameter '" + item + "' (expected secret=)");
      }
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
  }
  if (!authority.empty() && authority.back() == '/') authority.pop_back();
  size_t colon;
  if (!authority.empty() && authority[0] == '[') {
    const auto close = authority.find(']');
    if (close == std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "': unclosed '['");
    }
    host = authority.substr(1, close - 1);
    colon = close + 1;
    if (colon >= authority.size() || authority[colon] != ':') colon = std::string::npos;
  } else {
    colon = authority.rfind(':');
    host = authority.substr(0, colon);
  }
  if (host.empty() || colon == std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url + "' needs a host and a port: tcp://host:port");
  }
  const std::string port_text = authority.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || value < 0 || value > 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url + "': port '" + port_text + "' is not in [0, 65535]");
  }
  port = static_cast<uint16_t>(value);
}

}  // namespace

std::shared_ptr<Store> open_store(const std::string& url, std::chrono::milliseconds timeout,
                                  bool host) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url + "' has no scheme (expected tcp://HOST:PORT, file:///PATH or hash://)");
  }
  const std::string scheme = url.substr(0, scheme_end);
  const std::string rest = url.substr(scheme_end + 3);
  if (scheme == "file") {
    if (rest.empty() || rest[0] != '/') {
      throw Error(ErrorCode::kInvalidArgument,
                  "store URL '" + url + "' needs an absolute path: file:///path/to/file");
    }
    return std::make_shared<FileStore>(rest, timeout);
  }
  if (scheme == "hash") return std::make_shared<HashStore>(timeout);
  if (scheme == "tcp") {
    TCPStoreOptions options;
    options.timeout = timeout;
    options.host = host;
    std::string address;
    uint16_t port = 0;
    parse_tcp(url, rest, address, port, options.secret);
    if (options.secret.empty()) {
      if (const char* env = std::getenv("TUTTI_STORE_SECRET")) options.secret = env;
    }
    if (port == 0 && !host) {
      throw Error(ErrorCode::kInvalidArgument,
                  "store URL '" + url + "': port 0 only makes sense for the process that hosts");
    }
    return std::make_shared<TCPStore>(address, port, options);
  }
  if (scheme == "redis") {
    // redis://host:port[/db][?prefix=P&password=W]
    RedisStoreOptions options;
    options.timeout = timeout;
    std::string authority = rest, query;
    if (const auto q = rest.find('?'); q != std::string::npos) {
      authority = rest.substr(0, q);
      query = rest.substr(q + 1);
    }
    if (const auto slash = authority.find('/'); slash != std::string::npos) {
      const std::string db = authority.substr(slash + 1);
      authority = authority.substr(0, slash);
      if (!db.empty()) {
        char* end = nullptr;
        const long v = std::strtol(db.c_str(), &end, 10);
        if (*end != '\0' || v < 0) {
          throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "': bad db '" + db + "'");
        }
        options.db = static_cast<int>(v);
      }
    }
    size_t pos = 0;
    while (!query.empty() && pos <= query.size()) {
      const auto amp = query.find('&', pos);
      const std::string item = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (item.rfind("prefix=", 0) == 0) {
        options.prefix = item.substr(7);
      } else if (item.rfind("password=", 0) == 0) {
        options.password = item.substr(9);
      } else if (!item.empty()) {
        throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "': unknown parameter '" +
                                                     item + "' (expected prefix= or password=)");
      }
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
    std::string host;
    uint16_t port = 0;
    std::string unused_secret;
    parse_tcp(url, authority, host, port, unused_secret);
    return std::make_shared<RedisStore>(host, port, options);
  }
  if (scheme == "env") {
    throw Error(ErrorCode::kUnavailable,
                "store URL '" + url + "': the " + scheme +
                    ":// store is not built yet; give a file:///path store URL or a Store object "
                    "in GroupOptions");
  }
  throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "' has unknown scheme '" +
                                               scheme + "' (expected tcp://, file:// or hash://)");
}

}  // namespace tutti
