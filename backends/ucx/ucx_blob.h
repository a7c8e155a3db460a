// The ucx transport's bytes in a reference (ucx_plugin.cc): written by the owner at put, read by
// any consumer, so decoded with bounds checks; fuzzed (tests/fuzz/fuzz_ucx_blob.cc). Needs
// neither UCX nor tutti: plain C++ over tutti/plugin.h's types.
//
//   u32 n, the owner's UCX worker address (n bytes)
//   u32 regions, then per region: u32 n, its packed remote key (n bytes)
//   u32 tensors, then per tensor: u32 region (UINT32_MAX for an empty tensor), u64 address,
//   u64 bytes
// (little-endian, as the hosts of one job are).
#pragma once

#include <tutti/plugin.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace tutti_ucx {

// A failure carrying the plugin's result code.
struct Failure : std::runtime_error {
  Failure(tuttiResult_t code, const std::string& what) : std::runtime_error(what), code(code) {}
  tuttiResult_t code;
};

struct Writer {
  std::string out;
  void u32(uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
  void bytes(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    out.append(static_cast<const char*>(p), n);
  }
};

struct Reader {
  const char* p;
  size_t left;
  template <typename T>
  T get(const char* what) {
    if (left < sizeof(T))
      throw Failure(TUTTI_ERR_INVALID_ARGUMENT, std::string("a blob truncated at ") + what);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    left -= sizeof(T);
    return v;
  }
  std::string bytes(const char* what) {
    const uint32_t n = get<uint32_t>(what);
    if (n > left)
      throw Failure(TUTTI_ERR_INVALID_ARGUMENT, std::string("a blob truncated in ") + what);
    std::string s(p, n);
    p += n;
    left -= n;
    return s;
  }
};

// One tensor of a blob: its region, address and size at the owner.
struct Piece {
  uint32_t region;
  uint64_t address, bytes;
};

// What a blob describes (encode writes it; describe reads it), checked against the consumer's
// targets: as many pieces as targets, each of its target's size, each non-empty one in a region
// the blob has, nothing after them. Anything else throws Failure(TUTTI_ERR_INVALID_ARGUMENT).
struct Described {
  std::string address;             // the owner's worker
  std::vector<std::string> rkeys;  // packed, one per region
  std::vector<Piece> pieces;       // one per tensor
};

inline std::string encode(const std::string& address, const std::vector<const std::string*>& rkeys,
                          const std::vector<Piece>& pieces) {
  Writer w;
  w.bytes(address.data(), address.size());
  w.u32(static_cast<uint32_t>(rkeys.size()));
  for (const std::string* k : rkeys) w.bytes(k->data(), k->size());
  w.u32(static_cast<uint32_t>(pieces.size()));
  for (const Piece& p : pieces) {
    w.u32(p.region);
    w.u64(p.address);
    w.u64(p.bytes);
  }
  return std::move(w.out);
}

inline Described describe(const void* blob, size_t size, const tuttiTensor_v1_t* targets,
                          size_t count) {
  Reader r{static_cast<const char*>(blob), size};
  Described d;
  d.address = r.bytes("the owner's address");
  const uint32_t nregions = r.get<uint32_t>("the region count");
  if (nregions > 1u << 16) throw Failure(TUTTI_ERR_INVALID_ARGUMENT, "too many regions in a blob");
  for (uint32_t i = 0; i < nregions; ++i) d.rkeys.push_back(r.bytes("a remote key"));
  const uint32_t n = r.get<uint32_t>("the tensor count");
  if (n != count) {
    throw Failure(TUTTI_ERR_INVALID_ARGUMENT, "the blob describes " + std::to_string(n) +
                                                  " tensors, " + std::to_string(count) +
                                                  " targets");
  }
  d.pieces.resize(n);
  for (auto& p : d.pieces) {
    p.region = r.get<uint32_t>("a region index");
    p.address = r.get<uint64_t>("a tensor's address");
    p.bytes = r.get<uint64_t>("a tensor's size");
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (d.pieces[i].bytes != targets[i].nbytes) {
      throw Failure(TUTTI_ERR_INVALID_ARGUMENT,
                    "tensor " + std::to_string(i) + " has " + std::to_string(d.pieces[i].bytes) +
                        " bytes, its target " + std::to_string(targets[i].nbytes));
    }
    if (d.pieces[i].bytes > 0 && d.pieces[i].region >= nregions) {
      throw Failure(TUTTI_ERR_INVALID_ARGUMENT, "tensor " + std::to_string(i) + " names region " +
                                                    std::to_string(d.pieces[i].region));
    }
  }
  if (r.left != 0) {
    throw Failure(TUTTI_ERR_INVALID_ARGUMENT,
                  "a blob with " + std::to_string(r.left) + " bytes past its tensors");
  }
  return d;
}

}  // namespace tutti_ucx
