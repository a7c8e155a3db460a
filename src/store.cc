#include "tutti/store.h"

#include "tutti/error.h"
#include "tutti/file_store.h"
#include "tutti/hash_store.h"
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

std::shared_ptr<Store> open_store(const std::string& url, std::chrono::milliseconds timeout) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "store URL '" + url + "' has no scheme (expected file://PATH or hash://)");
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
  if (scheme == "tcp" || scheme == "redis" || scheme == "env") {
    throw Error(ErrorCode::kUnavailable,
                "store URL '" + url + "': the " + scheme +
                    ":// store is not built yet; give a file:///path store URL or a Store object "
                    "in GroupOptions");
  }
  throw Error(ErrorCode::kInvalidArgument, "store URL '" + url + "' has unknown scheme '" +
                                               scheme + "' (expected file:// or hash://)");
}

}  // namespace tutti
