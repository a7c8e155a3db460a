// What CollectiveGroup::grow stores for the new processes that join (internal): where the grown
// group meets and everything about it the members decided, as one record of text lines. A new
// process reads it from the store, so decode() checks every field.
#pragma once

#include <cstdint>
#include <string>

namespace tutti::detail {

// What the admission key holds when no grow is admitting (the last one ended).
constexpr const char* kAdmissionClosed = "closed";

struct Admission {
  std::string base;    // the meeting's key prefix
  std::string ledger;  // the ledger prefix the members' keys are noted in
  int world = 0;       // the members
  int add = 0;         // the new ranks
  std::string requested;
  bool inherited = false;
  std::string name;
  int64_t timeout_ms = 0;  // the grown group's op timeout
  int64_t meet_ms = 0;     // how long the members wait in the meeting
  std::string instance;
  bool check_ops = false;

  std::string encode() const;
  // Throws Error(kInternal) naming `key` for anything that is not a record encode() wrote.
  static Admission decode(const std::string& text, const std::string& key);
  // What every rank of the grown group claims, members and new ones alike.
  std::string join_label() const;
};

}  // namespace tutti::detail
