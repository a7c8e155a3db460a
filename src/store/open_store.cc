// open_store: a store from its URL (tutti/store.h).
#include <cstdlib>
#include <map>
#include <vector>

#include "store/store_util.h"
#include "tutti/env.h"
#include "tutti/error.h"
#include "tutti/file_store.h"
#include "tutti/hash_store.h"
#include "tutti/redis_store.h"
#include "tutti/store.h"
#include "tutti/tcp_store.h"
#include "util/tls.h"

namespace tutti {

namespace {

// Splits "authority?query" at the first '?'.
std::pair<std::string, std::string> split_query(const std::string& rest) {
  const auto q = rest.find('?');
  if (q == std::string::npos) return {rest, ""};
  return {rest.substr(0, q), rest.substr(q + 1)};
}

// "k=v&k2=v2": the values of the allowed keys; any other key is an error naming it (not its
// value: it may be a misspelt secret). `url` is the URL as errors show it (redacted).
std::map<std::string, std::string> parse_params(const std::string& url, const std::string& query,
                                                const std::vector<std::string>& allowed) {
  std::map<std::string, std::string> values;
  size_t pos = 0;
  while (pos < query.size()) {
    const auto amp = query.find('&', pos);
    const std::string item =
        query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (!item.empty()) {
      if (eq == std::string::npos ||
          std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string expected;
        for (const auto& k : allowed) expected += (expected.empty() ? "" : " or ") + k + "=";
        throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "': unknown parameter '" +
                                                     key + "' (expected " + expected + ")");
      }
      values[key] = item.substr(eq + 1);
    }
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return values;
}

// "host:port" (a trailing '/' allowed); IPv6 hosts come in brackets: "[::1]:29500". `url` is
// the URL as errors show it (redacted).
void parse_host_port(const std::string& url, std::string authority, std::string& host,
                     uint16_t& port) {
  if (!authority.empty() && authority.back() == '/') authority.pop_back();
  if (authority.find('@') != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url +
                    "': credentials in the address are not supported; give them with ?secret= "
                    "(tcp://) or ?password= (redis://)");
  }
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

std::shared_ptr<Store> open_store(const std::string& full_url, std::chrono::milliseconds timeout,
                                  bool host) {
  // Errors show the URL without its secrets.
  const std::string url = detail::redact_url(full_url);
  const auto scheme_end = full_url.find("://");
  if (scheme_end == std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url +
                    "' has no scheme (expected tcp://HOST:PORT, redis://HOST:PORT, file:///PATH, "
                    "hash:// or env://)");
  }
  const std::string scheme = full_url.substr(0, scheme_end);
  const std::string rest = full_url.substr(scheme_end + 3);
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
    const auto [authority, query] = split_query(rest);
    std::string address;
    uint16_t port = 0;
    parse_host_port(url, authority, address, port);
    auto params = parse_params(url, query, {"secret", "tls"});
    options.secret = params["secret"];
    if (options.secret.empty()) {
      if (const char* env = std::getenv("TUTTI_STORE_SECRET")) options.secret = env;
    }
    if (params.count("tls")) {
      const std::string& t = params["tls"];
      if (t != "0" && t != "1") {
        throw Error(ErrorCode::kInvalidArgument,
                    "store URL '" + url + "': tls must be 0 or 1, not '" + t + "'");
      }
      options.tls = t == "1";
    } else {
      options.tls = detail::tls_from_env("TUTTI_STORE_TLS");
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
    auto [authority, query] = split_query(rest);
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
    auto params = parse_params(url, query, {"prefix", "password"});
    if (params.count("prefix")) options.prefix = params["prefix"];
    options.password = params["password"];
    std::string host;
    uint16_t port = 0;
    parse_host_port(url, authority, host, port);
    return std::make_shared<RedisStore>(host, port, options);
  }
  if (scheme == "env") {
    // The launcher's store (tutti-run, torchrun, srun, mpirun: see tutti/env.h).
    if (url != "env://") {
      throw Error(ErrorCode::kInvalidArgument,
                  "store URL '" + url + "': env:// takes nothing after it");
    }
    LaunchEnv env;
    try {
      env = read_launch_env();
    } catch (const Error& e) {
      throw Error(e.code(),
                  "store URL 'env://' names the launcher's store: " + std::string(e.what()));
    }
    return open_store(env.store_url, timeout, host);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "store URL '" + url + "' has unknown scheme '" + scheme +
                  "' (expected tcp://, redis://, file://, hash:// or env://)");
}

}  // namespace tutti
