// Admission::decode: the record a grow's rank 0 stores and every joining process reads from the
// store (group/admission.h). Whatever decodes must encode to a record that decodes to the same
// fields; anything else must fail with kInternal naming the key.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "group/admission.h"
#include "tutti/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tutti::detail::Admission a;
  try {
    a = tutti::detail::Admission::decode(text, "fuzz/admit");
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kInternal) std::abort();
    return 0;
  }
  const std::string again = a.encode();
  const tutti::detail::Admission b = tutti::detail::Admission::decode(again, "fuzz/admit");
  if (b.encode() != again || b.world != a.world || b.add != a.add || b.name != a.name ||
      b.base != a.base || b.meet_ms != a.meet_ms || a.join_label().empty()) {
    std::abort();
  }
  return 0;
}
