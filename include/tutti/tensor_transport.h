// TensorTransport: how a TransferAgent moves an object's bytes, and the registry of transports
// by name (custom transports register here; see examples/custom_transport.cc).
//
// A transport has an owner side (publish at put, unpublish once the object is freed, answer the
// consumers' calls) and a consumer side (fetch). The agent does the rest: references, the object
// table and its lifetime, and, for one-sided transports (the consumer reads the owner's memory
// itself), the consumer's lease that keeps the owner from freeing the object while a copy or a
// borrow reads it. A transport's consumer side reaches its owner side through TransportPeer
// (a request/reply channel between the two agents, which may carry file descriptors on one host).
//
// Names are case-insensitive; transports are looked up when a reference is resolved, so they
// may be registered at any time before that. Threads: an agent calls a transport's methods from
// any thread, concurrently: a transport must be thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tutti/export.h"
#include "tutti/tensor_ref.h"
#include "tutti/tensor_view.h"

namespace tutti {

struct TransportTraits {
  bool one_sided = true;    // the consumer reads the owner's memory (the agent leases it)
  bool can_borrow = false;  // fetch can return views of the owner's memory
  bool cross_host = false;  // works between hosts (else only where the host keys match)
  bool cuda = false;        // carries CUDA tensors (else CPU tensors)
};

// The owner's side of put. (PutOptions::snapshot is the agent's business: it copies first, into
// the transport's allocate() memory where it has any, and publishes the copy.)
struct PublishRequest {
  ObjectId object;
  const std::vector<TensorView>& tensors;
  void* stream = nullptr;  // PutOptions::stream (CUDA: the producer's stream)
};

struct Publication {
  std::string blob;  // the transport's bytes in the reference (at most 64 KiB)
  // Where each tensor lies: (region, byte offset), as the transport numbers them; may be empty.
  std::vector<std::pair<uint16_t, uint64_t>> places;
};

// The consumer's line to the owner's agent.
class TUTTI_API TransportPeer {
 public:
  virtual ~TransportPeer();
  virtual const AgentIdentity& owner() const = 0;
  // Sends `request` to the owner's transport of the same name (TensorTransport::answer) and
  // returns its reply; `fds` receives the file descriptors the reply carried (the caller owns
  // them). Throws kIoError when the owner is gone, kTimeout past the fetch's deadline.
  virtual std::string call(const std::string& request, std::vector<int>* fds = nullptr) = 0;
  // Has the owner's agent write the object's bytes to the connection, read into `into` (one
  // buffer per tensor, of its size): the built-in socket transport's path, open to any transport.
  virtual void stream(const std::vector<TensorView>& into) = 0;
};

// The consumer's side of get and borrow.
struct FetchRequest {
  const TensorRef& ref;
  TransportPeer& owner;
  // get: copy into these (one per tensor, checked by the agent). borrow: empty.
  const std::vector<TensorView>& targets;
  bool borrow = false;
  std::chrono::steady_clock::time_point deadline;
  const std::atomic<bool>& cancelled;  // long copies check it now and then
  void* stream = nullptr;              // GetOptions::stream (CUDA: the consumer's stream)
};

struct FetchResult {
  std::vector<TensorView> views;  // borrow: views of the owner's memory
  std::shared_ptr<void> keep;     // whatever the views need alive (a mapping)
};

class TUTTI_API TensorTransport {
 public:
  virtual ~TensorTransport();
  virtual const char* name() const = 0;
  virtual TransportTraits traits() const = 0;
  // Owner, at put (or fulfil): make the tensors reachable; the result goes into the reference.
  virtual Publication publish(const PublishRequest& request) = 0;
  // Owner, once the object is freed (no consumer reads it any more). Must not throw.
  virtual void unpublish(ObjectId object) noexcept;
  // Consumer: copy into request.targets, or (borrow) return views.
  virtual FetchResult fetch(const FetchRequest& request) = 0;
  // Owner: answers a consumer's TransportPeer::call. Default: kUnavailable.
  virtual std::string answer(const std::string& request, const AgentIdentity& consumer,
                             std::vector<int>* fds);
  // CPU memory this transport can share without copying (TransferAgent::allocate), and its
  // release. Default: kUnavailable.
  virtual TensorView allocate(size_t bytes, DType dtype);
  virtual void deallocate(const TensorView& memory);
  // Whether `memory` came from allocate().
  virtual bool owns(const TensorView& memory) const;
  // The caller's CPU memory, made shareable once (TransferAgent::register_memory): with `fd`, the
  // file it is mapped MAP_SHARED from at `fd_offset` (the transport keeps its own descriptor).
  // Default: kUnavailable.
  virtual void register_memory(const TensorView& region, int fd, uint64_t fd_offset);
  virtual void unregister_memory(const TensorView& region);
};

// What a transport is created with, once per agent.
struct TransportContext {
  AgentIdentity agent;
};

using TensorTransportFactory =
    std::function<std::unique_ptr<TensorTransport>(const TransportContext&)>;

// Throws Error(kInvalidUsage) for a name already registered, kInvalidArgument for an empty name
// or a null factory.
TUTTI_API void register_tensor_transport(std::string_view name, TensorTransportFactory factory,
                                         std::function<bool()> available = nullptr);
TUTTI_API bool is_registered_tensor_transport(std::string_view name);
TUTTI_API std::vector<std::string> registered_tensor_transports();

}  // namespace tutti
