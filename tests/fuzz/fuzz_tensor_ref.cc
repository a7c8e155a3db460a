// TensorRef::parse and from_text: the bytes of a reference another process made.
//
// The first byte picks how the rest is used: as the whole ref (most inputs stop at the checksum),
// as a ref body behind a header this harness makes valid (magic, version, flags, length and
// checksum right, so that every field after them is exercised), or as the text form. Whatever
// parses must describe, print and serialise without trouble, and its bytes must parse again to
// the same bytes. Anything else must fail with kInvalidArgument.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "transfer/wire.h"
#include "tutti/error.h"
#include "tutti/tensor_ref.h"

namespace {

constexpr size_t kCrcOffset = 10;  // magic 4, version 1, flags 1, total length 4

std::string with_valid_header(std::string_view rest) {
  std::string bytes = "TTRF";
  bytes.push_back(static_cast<char>(tutti::TensorRef::kVersion));
  bytes.push_back(static_cast<char>(rest.empty() ? 0 : rest[0] & 7));
  bytes.append(8, '\0');  // total length, checksum
  if (!rest.empty()) bytes.append(rest.substr(1));
  const uint32_t total = static_cast<uint32_t>(bytes.size());
  for (int i = 0; i < 4; ++i) bytes[6 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  const uint32_t crc = tutti::detail::crc32c(bytes);
  for (int i = 0; i < 4; ++i) bytes[kCrcOffset + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    tutti::TensorRef ref;
    switch (data[0] % 3) {
      case 0: ref = tutti::TensorRef::parse(rest); break;
      case 1: ref = tutti::TensorRef::parse(with_valid_header(rest)); break;
      default: ref = tutti::TensorRef::from_text(rest); break;
    }
    const std::string bytes = ref.serialize();
    if (tutti::TensorRef::parse(bytes).serialize() != bytes) std::abort();
    if (ref.describe().empty()) std::abort();
    if (tutti::TensorRef::from_text(ref.to_text()).serialize() != bytes) std::abort();
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kInvalidArgument) std::abort();
  }
  return 0;
}
