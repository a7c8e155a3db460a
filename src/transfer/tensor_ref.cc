#include "tutti/tensor_ref.h"

#include <cstdio>
#include <limits>
#include <sstream>

#include "transfer/lease_table.h"
#include "transfer/wire.h"
#include "util/crypto.h"

namespace tutti {
namespace {

constexpr char kMagic[4] = {'T', 'T', 'R', 'F'};
constexpr uint8_t kTwoSided = 1;
constexpr uint8_t kSigned = 2;
constexpr uint8_t kPending = 4;
constexpr size_t kCrcOffset = 4 + 1 + 1 + 4;  // magic, version, flags, total length
constexpr const char* kTextPrefix = "tutti-ref:1:";
constexpr size_t kMaxTransportName = 32;

uint64_t checked_nbytes(const TensorMeta& m, const std::string& what) {
  uint64_t n = dtype_size(m.dtype);
  for (int64_t d : m.shape) {
    if (d < 0)
      throw Error(ErrorCode::kInvalidArgument, what + ": negative dimension " + std::to_string(d));
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      throw Error(ErrorCode::kInvalidArgument, what + ": shape overflows a 64-bit byte count");
    }
    n *= static_cast<uint64_t>(d);
  }
  // Beyond 2^62 bytes no machine holds it, and numel() would no longer fit an int64.
  if (n > (uint64_t{1} << 62)) {
    throw Error(ErrorCode::kInvalidArgument, what + ": " + std::to_string(n) + " bytes");
  }
  return n;
}

}  // namespace

int64_t TensorMeta::numel() const {
  // A zero dimension anywhere makes the tensor empty, whatever the others are, as for a
  // TensorView: [2^56, 255, 0] holds nothing, though its first two dimensions' product (which
  // parse does not bound, the tensor holding no bytes) does not fit an int64 (found by fuzzing).
  // Others are bounded where they come in (parse, reserve), so the product is taken unsigned:
  // never undefined.
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    n *= static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(n);
}

uint64_t TensorMeta::nbytes() const {
  return static_cast<uint64_t>(numel()) * dtype_size(dtype);
}

std::string TensorMeta::str() const {
  std::ostringstream out;
  out << to_string(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "] on " << device.str();
  return out.str();
}

std::string AgentIdentity::uuid_text() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < uuid.size(); ++i) {
    out[2 * i] = kHex[uuid[i] >> 4];
    out[2 * i + 1] = kHex[uuid[i] & 15];
  }
  return out;
}

TensorRef::TensorRef(AgentIdentity owner, ObjectId object, std::string transport,
                     std::vector<TensorMeta> tensors,
                     std::vector<std::pair<uint16_t, uint64_t>> places, std::string blob,
                     bool two_sided, bool pending)
    : owner_(std::move(owner)),
      object_(object),
      transport_(std::move(transport)),
      tensors_(std::move(tensors)),
      places_(std::move(places)),
      blob_(std::move(blob)),
      two_sided_(two_sided),
      pending_(pending) {
  places_.resize(tensors_.size(), {0, 0});
}

std::string TensorRef::describe() const {
  return "object " + std::to_string(object_.id) + " of agent '" + owner_.name + "' (" + transport_ +
         ")";
}

std::string TensorRef::body() const {
  WireWriter w;
  // One allocation (the fields' sizes, the tensors', and room for serialize()'s HMAC): growing
  // the string field by field took ~4 of them, ~50 ns of a verify's ~0.5 us.
  size_t size = 128 + owner_.tcp_endpoint.size() + owner_.name.size() + transport_.size() +
                blob_.size() + hmac_.size();
  for (const TensorMeta& t : tensors_) size += 16 + 8 * t.shape.size();
  w.out().reserve(size);
  w.bytes(kMagic, 4);
  w.u8(kVersion);
  w.u8(static_cast<uint8_t>((two_sided_ ? kTwoSided : 0) | (signed_ ? kSigned : 0) |
                            (pending_ ? kPending : 0)));
  w.u32(0);  // total length, set below
  w.u32(0);  // CRC32C, set by serialize()
  w.bytes(owner_.uuid.data(), 16);
  w.bytes(owner_.host_key.data(), 16);
  w.u32(owner_.pid);
  w.u64(owner_.start_time);
  w.str8(owner_.tcp_endpoint.substr(0, 255));
  w.str8(owner_.name.substr(0, 255));
  w.u64(object_.id);
  w.u32(object_.generation);
  w.u32(object_.slot);
  w.str8(transport_.substr(0, kMaxTransportName));
  w.u32(static_cast<uint32_t>(tensors_.size()));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorMeta& t = tensors_[i];
    w.u8(static_cast<uint8_t>(t.dtype));
    w.u8(static_cast<uint8_t>(t.device.type));
    w.u16(static_cast<uint16_t>(t.device.index));
    w.u8(static_cast<uint8_t>(t.shape.size()));
    w.u16(places_[i].first);
    w.u64(places_[i].second);
    for (int64_t d : t.shape) w.i64(d);
  }
  w.str32(blob_);
  return std::move(w.out());
}

std::string TensorRef::serialize() const {
  std::string out = body();
  if (signed_) out.append(reinterpret_cast<const char*>(hmac_.data()), hmac_.size());
  const uint32_t total = static_cast<uint32_t>(out.size());
  for (int i = 0; i < 4; ++i) out[6 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
  const uint32_t crc = detail::crc32c(out);
  for (int i = 0; i < 4; ++i) out[kCrcOffset + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  return out;
}

TensorRef TensorRef::parse(std::string_view bytes) {
  WireReader r(bytes, "tensor ref");
  char magic[4];
  r.bytes(magic, 4, "magic");
  if (std::string_view(magic, 4) != std::string_view(kMagic, 4)) {
    r.fail("not a tutti tensor ref (bad magic)");
  }
  const uint8_t version = r.u8("version");
  if (version != kVersion) {
    r.fail("ref version " + std::to_string(version) + ", this tutti reads " +
           std::to_string(kVersion));
  }
  const uint8_t flags = r.u8("flags");
  if ((flags & ~(kTwoSided | kSigned | kPending)) != 0) {
    r.fail("unknown flags " + std::to_string(flags));
  }
  const uint32_t total = r.u32("total length");
  if (total != bytes.size()) {
    r.fail("length field says " + std::to_string(total) + " bytes, the ref has " +
           std::to_string(bytes.size()));
  }
  const uint32_t crc = r.u32("checksum");
  {
    std::string zeroed(bytes);
    for (int i = 0; i < 4; ++i) zeroed[kCrcOffset + i] = 0;
    if (detail::crc32c(zeroed) != crc) r.fail("checksum mismatch (the ref was damaged)");
  }
  TensorRef ref;
  ref.two_sided_ = (flags & kTwoSided) != 0;
  ref.signed_ = (flags & kSigned) != 0;
  ref.pending_ = (flags & kPending) != 0;
  r.bytes(ref.owner_.uuid.data(), 16, "owner id");
  r.bytes(ref.owner_.host_key.data(), 16, "owner host key");
  ref.owner_.pid = r.u32("owner pid");
  ref.owner_.start_time = r.u64("owner start time");
  ref.owner_.tcp_endpoint = r.str8("owner endpoint");
  ref.owner_.name = r.str8("owner name");
  ref.object_.id = r.u64("object id");
  ref.object_.generation = r.u32("object generation");
  ref.object_.slot = r.u32("object slot");
  if (ref.object_.slot >= detail::SlotPage::kCapacity) {
    r.fail("object slot " + std::to_string(ref.object_.slot) + " (owners have " +
           std::to_string(detail::SlotPage::kCapacity) + ")");
  }
  ref.transport_ = r.str8("transport");
  if (ref.transport_.empty() || ref.transport_.size() > kMaxTransportName) {
    r.fail("transport name of " + std::to_string(ref.transport_.size()) + " bytes");
  }
  const uint32_t count = r.u32("tensor count");
  // Each tensor takes at least 15 bytes: a count beyond what is left is a lie.
  if (count > kMaxTensors || static_cast<uint64_t>(count) * 15 > r.left()) {
    r.fail("tensor count " + std::to_string(count) + " does not fit the ref");
  }
  ref.tensors_.reserve(count);
  ref.places_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const std::string what = "tensor " + std::to_string(i);
    TensorMeta m;
    const uint8_t dtype = r.u8("dtype");
    if (dtype > static_cast<uint8_t>(DType::kFloat64))
      r.fail(what + ": unknown dtype " + std::to_string(dtype));
    m.dtype = static_cast<DType>(dtype);
    const uint8_t device = r.u8("device type");
    if (device > static_cast<uint8_t>(DeviceType::kCUDA)) {
      r.fail(what + ": unknown device type " + std::to_string(device));
    }
    m.device.type = static_cast<DeviceType>(device);
    m.device.index = r.u16("device index");
    const uint8_t ndim = r.u8("ndim");
    if (ndim > kMaxDims)
      r.fail(what + ": ndim " + std::to_string(ndim) + " > " + std::to_string(kMaxDims));
    const uint16_t region = r.u16("region");
    const uint64_t offset = r.u64("offset");
    for (uint8_t d = 0; d < ndim; ++d) m.shape.push_back(r.i64("dimension"));
    checked_nbytes(m, "tensor ref: " + what);
    ref.tensors_.push_back(std::move(m));
    ref.places_.emplace_back(region, offset);
  }
  ref.blob_ = r.str32("transport bytes", kMaxBlob);
  if (ref.signed_) r.bytes(ref.hmac_.data(), ref.hmac_.size(), "hmac");
  if (r.left() != 0) r.fail(std::to_string(r.left()) + " bytes after the end");
  return ref;
}

std::string TensorRef::to_text() const {
  return kTextPrefix + detail::base64url_encode(serialize());
}

TensorRef TensorRef::from_text(std::string_view text) {
  const std::string_view prefix(kTextPrefix);
  if (text.substr(0, prefix.size()) != prefix) {
    throw Error(ErrorCode::kInvalidArgument,
                "tensor ref text must start with '" + std::string(prefix) + "'");
  }
  std::string bytes;
  if (!detail::base64url_decode(text.substr(prefix.size()), bytes)) {
    throw Error(ErrorCode::kInvalidArgument, "tensor ref text is not base64url");
  }
  return parse(bytes);
}

void TensorRef::sign(const std::string& key) {
  signed_ = true;
  hmac_ = detail::hmac_sha256(key, body());
}

bool TensorRef::verify(const std::string& key) const {
  if (!signed_) return false;
  const auto want = detail::hmac_sha256(key, body());
  return detail::same_secret(want.data(), want.size(), hmac_.data(), hmac_.size());
}

}  // namespace tutti
