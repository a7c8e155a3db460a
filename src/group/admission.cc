#include "group/admission.h"

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "tutti/error.h"

namespace tutti::detail {

std::string Admission::encode() const {
  return "tutti-admission 1\n" + base + "\n" + ledger + "\n" + std::to_string(world) + "\n" +
         std::to_string(add) + "\n" + requested + "\n" + (inherited ? "1" : "0") + "\n" + name +
         "\n" + std::to_string(timeout_ms) + "\n" + instance + "\n" + (check_ops ? "1" : "0") +
         "\n" + std::to_string(meet_ms);
}

Admission Admission::decode(const std::string& text, const std::string& key) {
  std::vector<std::string> f;
  for (size_t at = 0; at <= text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    f.push_back(text.substr(at, nl - at));
    at = nl + 1;
    if (f.size() > 12) break;  // more lines than a record has: refused below
  }
  const auto damaged = [&] {
    return Error(ErrorCode::kInternal, "the admission record in " + key + " is damaged");
  };
  const auto number = [&](const std::string& v, int64_t lo, int64_t hi) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) throw damaged();
    return static_cast<int64_t>(x);
  };
  if (f.size() != 12 || f[0] != "tutti-admission 1") {
    throw Error(ErrorCode::kInternal,
                "the admission record in " + key + " is not one this version of tutti reads");
  }
  Admission a;
  a.base = f[1];
  a.ledger = f[2];
  a.world = static_cast<int>(number(f[3], 1, 1 << 20));
  a.add = static_cast<int>(number(f[4], 1, 1 << 20));
  a.requested = f[5];
  a.inherited = number(f[6], 0, 1) == 1;
  a.name = f[7];
  a.timeout_ms = number(f[8], 1, int64_t{1} << 40);
  a.instance = f[9];
  a.check_ops = number(f[10], 0, 1) == 1;
  a.meet_ms = number(f[11], 1, int64_t{1} << 40);
  if (a.base.empty() || a.name.empty() || a.requested.empty() || a.world > (1 << 20) - a.add) {
    throw damaged();
  }
  return a;
}

std::string Admission::join_label() const {
  return requested + " grow of " + std::to_string(world) + " by " + std::to_string(add);
}

}  // namespace tutti::detail
