#include "tutti/store.h"

#include <algorithm>

#include "store/store_util.h"
#include "tutti/error.h"

namespace tutti {

Store::~Store() = default;

namespace detail {
std::string redact_url(const std::string& url) {
  std::string out = url;
  const auto scheme_end = out.find("://");
  if (scheme_end != std::string::npos) {
    // user:password@ in the authority
    const size_t start = scheme_end + 3;
    const size_t end = std::min(out.find_first_of("/?#", start), out.size());
    const auto at = out.rfind('@', end == 0 ? 0 : end - 1);
    if (at != std::string::npos && at >= start) out.replace(start, at - start, "***");
  }
  const auto q = out.find('?');
  if (q == std::string::npos) return out;
  std::string query;
  size_t pos = q + 1;
  while (pos <= out.size()) {
    const auto amp = std::min(out.find('&', pos), out.size());
    std::string item = out.substr(pos, amp - pos);
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    // Only values known to be harmless are shown: an unknown key may be a misspelt secret.
    if (eq != std::string::npos && key != "prefix") item = key + "=***";
    query += (query.empty() ? "" : "&") + item;
    pos = amp + 1;
  }
  return out.substr(0, q + 1) + query;
}

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

int64_t add_to_counter(const std::string& key, const std::string* current, int64_t delta) {
  const int64_t now = current == nullptr ? 0 : parse_counter(key, *current);
  int64_t sum = 0;
  if (__builtin_add_overflow(now, delta, &sum)) {
    throw Error(ErrorCode::kInvalidArgument, "store key '" + key + "': add(" +
                                                 std::to_string(delta) + ") to " +
                                                 std::to_string(now) + " overflows an int64");
  }
  return sum;
}
}  // namespace detail

}  // namespace tutti
