// Helpers shared by the Store implementations (internal).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/store.h"

namespace tutti::detail {

// The keys of `keys` that `store` does not hold now, in order (one check each): what a timeout
// names.
inline std::vector<std::string> missing_keys(Store& store, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!store.check({k})) missing.push_back(k);
  }
  return missing;
}

// The kTimeout error every store throws when keys are still missing at the deadline.
inline Error store_timeout(const char* store, std::chrono::milliseconds timeout,
                           const std::vector<std::string>& missing) {
  std::string list;
  for (const auto& key : missing) list += (list.empty() ? "'" : ", '") + key + "'";
  return Error(ErrorCode::kTimeout, std::string(store) + ": timed out after " +
                                        std::to_string(timeout.count()) +
                                        " ms waiting for key(s) " + list);
}

// The URL as messages may show it: every query value but prefix= (secret=, password=, and any
// unknown key, which may be a misspelt one) and any user:password@ in the address replaced by
// "***".
std::string redact_url(const std::string& url);

// Parses a value written by add(); throws kInvalidUsage naming the key otherwise.
int64_t parse_counter(const std::string& key, const std::string& value);

// What add(key, delta) leaves in a counter holding `current` (null: none yet); throws
// kInvalidArgument naming the key when the sum does not fit an int64 (found by fuzzing the TCP
// store: the server computed it with a signed overflow).
int64_t add_to_counter(const std::string& key, const std::string* current, int64_t delta);

}  // namespace tutti::detail
