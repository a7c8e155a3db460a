// TensorRef: a small, self-contained, serialisable reference to tensors a TransferAgent
// published (see tutti/transfer_agent.h). Hand it to any peer, through a group, a store, a file
// or anything that carries bytes; the peer resolves it with its own agent.
//
// The format is binary, little-endian and versioned: magic "TTRF", a version, the length and a
// CRC32C of the whole reference; the owner (agent id, a host key that tells hosts and network and
// pid namespaces apart, pid and process start time, endpoints, name); the object (id, generation,
// transport); each tensor (dtype, device, shape, region and offset); the transport's own bytes;
// optionally an HMAC-SHA256 keyed with the store secret. parse() checks every length before it
// reads and names the field at fault.
//
// Threads: a TensorRef is an immutable value, safe to copy and read from any thread.
// Errors: parse() and from_text() throw Error(kInvalidArgument).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/export.h"
#include "tutti/types.h"

namespace tutti {

// Names an object of one agent: ids are never reused by an agent; the generation tells a
// reference from an older object that used the same table slot.
struct ObjectId {
  uint64_t id = 0;
  uint32_t generation = 0;
  uint32_t slot = 0;  // where the owner keeps its state (for leases on one host)
};

// What the consumer learns of a tensor before fetching it.
struct TUTTI_API TensorMeta {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  Device device;

  int64_t numel() const;
  uint64_t nbytes() const;
  std::string str() const;  // "float32[2, 3] on cpu"
};

// Who published an object.
struct TUTTI_API AgentIdentity {
  std::array<uint8_t, 16> uuid{};      // random per agent
  std::array<uint8_t, 16> host_key{};  // equal exactly when two agents share a host, network
                                       // namespace and pid namespace
  uint32_t pid = 0;
  uint64_t start_time = 0;   // the process's start time: a reused pid is told apart
  std::string name;          // for messages
  std::string tcp_endpoint;  // "host:port", empty when the agent does not listen on TCP

  bool same_host(const AgentIdentity& other) const { return host_key == other.host_key; }
  std::string uuid_text() const;
};

class TUTTI_API TensorRef {
 public:
  static constexpr uint8_t kVersion = 1;
  static constexpr uint32_t kMaxTensors = 1u << 20;
  static constexpr uint32_t kMaxBlob = 1u << 20;  // a transport's bytes (shm: 16 per tensor)
  static constexpr uint8_t kMaxDims = 16;

  TensorRef() = default;

  std::string serialize() const;
  static TensorRef parse(std::string_view bytes);
  // "tutti-ref:1:<base64url of serialize()>"
  std::string to_text() const;
  static TensorRef from_text(std::string_view text);

  const AgentIdentity& owner() const { return owner_; }
  ObjectId object() const { return object_; }
  const std::string& transport() const { return transport_; }
  const std::vector<TensorMeta>& tensors() const { return tensors_; }
  // Where each tensor lies in the transport's regions (region index, byte offset).
  const std::vector<std::pair<uint16_t, uint64_t>>& places() const { return places_; }
  const std::string& blob() const { return blob_; }
  bool is_two_sided() const { return two_sided_; }
  bool is_signed() const { return signed_; }
  // Made by reserve(): where the data lies is known once the owner fulfils it (the consumer
  // asks the owner then).
  bool is_pending() const { return pending_; }
  // "object 12 of agent 'trainer' (shm)"
  std::string describe() const;

  // For agents: a reference with every field set (the agent signs it when it has a secret).
  TensorRef(AgentIdentity owner, ObjectId object, std::string transport,
            std::vector<TensorMeta> tensors, std::vector<std::pair<uint16_t, uint64_t>> places,
            std::string blob, bool two_sided, bool pending = false);
  // Signs with `key` (an HMAC over the reference); verify() checks it. An unsigned reference
  // fails verify() when a key is given.
  void sign(const std::string& key);
  bool verify(const std::string& key) const;

 private:
  std::string body() const;  // everything the CRC and the HMAC cover

  AgentIdentity owner_;
  ObjectId object_;
  std::string transport_;
  std::vector<TensorMeta> tensors_;
  std::vector<std::pair<uint16_t, uint64_t>> places_;
  std::string blob_;
  bool two_sided_ = false;
  bool signed_ = false;
  bool pending_ = false;
  std::array<uint8_t, 32> hmac_{};
};

}  // namespace tutti
