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

#include "tutti/error.h"
#include "tutti/export.h"
#include "tutti/tensor_ref.h"
#include "tutti/tensor_view.h"
#include "tutti/types.h"

namespace tutti {

struct TransportTraits {
  bool one_sided = true;    // the consumer reads the owner's memory (the agent leases it)
  bool can_borrow = false;  // fetch can return views of the owner's memory
  bool cross_host = false;  // works between hosts (else only where the host keys match)
  bool cuda = false;        // carries CUDA tensors (else CPU tensors)
  // The transport holds the object at the owner for each fetch itself (the socket stream, the
  // two-sided send through TransportOwner::hold), and a completed fetch counts as one of the
  // object's expected gets there: the agent takes no lease around it. Such a transport is also
  // published at reserve (with no tensors: its reference bytes may not depend on them), and
  // again at fulfil.
  bool holds_itself = false;
};

// Whether this agent can fetch a ref over its transport (TensorTransport::reach).
struct Reach {
  bool direct = true;
  // Otherwise: why not, and the error it is when the agent does not fall back to the socket
  // transport (GetOptions::allow_fallback, for CPU tensors of an owner it can connect to).
  ErrorCode code = ErrorCode::kUnavailable;
  std::string why;
};

// The owner's side of put. (PutOptions::snapshot is the agent's business: it copies first, into
// the transport's allocate() memory where it has any, and publishes the copy.)
struct PublishRequest {
  ObjectId object;
  const std::vector<TensorView>& tensors;
  void* stream = nullptr;  // PutOptions::stream (CUDA: the producer's stream)
};

struct Publication {
  std::string blob;  // the transport's bytes in the reference (at most TensorRef::kMaxBlob)
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
  // As call(), the request made by `make` once the connection to the owner is up: a failure
  // before `make` ran never reached the owner. For a request that uses something up (a number
  // in a sequence both sides keep) that a connection failing first must not waste. `replied`
  // (when given) is set once the owner's reply came, an answer or its error: an error thrown
  // with it unset is the connection's (the request may or may not have reached the owner).
  // Default: call(make(), fds).
  virtual std::string call_with(const std::function<std::string()>& make,
                                std::vector<int>* fds = nullptr, bool* replied = nullptr);
};

// A transport's hold on one of its owner's objects (TransportOwner::hold): the object stays
// published, and its tensors unchanged by the agent, until `release` is called, exactly once,
// from any thread, also after the call that took it returned (a send that ends later);
// `completed`: the consumer has the bytes, which counts as one of the object's expected gets.
struct HeldObject {
  std::vector<TensorView> tensors;
  std::function<void(bool completed)> release;
};

// The owner's agent as its transports see it while they answer a consumer: holds on its objects.
class TUTTI_API TransportOwner {
 public:
  virtual ~TransportOwner();
  // Holds `object` (its id and generation) when it is published on the answering transport,
  // waiting until `deadline` while it is reserved. Throws kTimeout (still reserved at the
  // deadline), kRemoteError (the owner failed it), kInvalidUsage (freed, or being freed),
  // kInvalidArgument (published on another transport).
  virtual HeldObject hold(ObjectId object, std::chrono::steady_clock::time_point deadline) = 0;
};

// A consumer's TransportPeer::call, as the owner's transport answers it.
struct AnswerRequest {
  const std::string& request;
  const AgentIdentity& consumer;
  std::vector<int>*
      fds;  // descriptors to send with the reply (on one host; the caller closes them)
  TransportOwner& owner;
  // Work the transport leaves for the answering thread (it sets the function; null: none):
  // the owner's serving thread runs it once the reply is sent, or failed to be, before it reads
  // the consumer's next request. For a transfer that follows the reply (a two-sided send), so
  // that it starts on the thread that is awake anyway. It holds up that connection (tutti's
  // consumer keeps it to itself for the get) and the agent's stop until it ends: stop() must
  // end it. Must not throw. Null where the caller runs nothing after the reply: the transport then
  // does the work elsewhere.
  std::function<void()>* then = nullptr;
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
  // borrow: the consumer may write the views (GetOptions::copy_on_write): views of the owner's
  // memory must be private copy-on-write mappings of it, never the owner's pages themselves.
  bool writable = false;
};

struct FetchResult {
  std::vector<TensorView> views;  // borrow: views of the owner's memory
  std::shared_ptr<void> keep;     // whatever the views need alive (a mapping)
  // borrow: whether any view lies in the owner's memory. False when every view is a copy of the
  // transport's own: the agent then lets the object go at once instead of when the views go.
  bool shares_owner_memory = true;
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
  // Consumer, before any I/O: whether agent `me` can fetch `ref` this way. Default: directly
  // where the transport works across hosts or the owner is on this host (same host key).
  virtual Reach reach(const TensorRef& ref, const AgentIdentity& me) const;
  // The agent stops: end the transport's threads and what waits on them (before the agent's
  // objects go). Called once the agent takes no more connections and has told its serving
  // threads to end, before it waits for them: an answer (or its AnswerRequest::then) may still
  // be running, and should end soon after with an error. Default: nothing. Must not throw.
  virtual void stop() noexcept;
  // Owner: answers a consumer's TransportPeer::call. Default: kUnavailable.
  virtual std::string answer(const std::string& request, const AgentIdentity& consumer,
                             std::vector<int>* fds);
  // As answer(), with the owner's holds at hand (TransportOwner): what the agent calls. Default:
  // answer(request.request, request.consumer, request.fds), for transports that need no hold.
  virtual std::string answer_with(const AnswerRequest& request);
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

// A transport as the registry knows it before any agent makes one (BackendInfo's counterpart).
struct TransportInfo {
  std::string name;  // case-insensitive, not "auto"
  TensorTransportFactory factory;
  // Whether it can work in this process (a GPU is visible, its library loads); null: always.
  std::function<bool()> available;
  // The devices of the tensors it carries.
  std::vector<DeviceType> devices{DeviceType::kCPU};
  // PutOptions::transport = "auto" takes the available transport of highest priority that
  // carries the tensors' device (built in: shm 20 and socket 10 for CPU tensors, cuda_ipc 20 for
  // CUDA ones). Negative: never "auto" (the two-sided gloo and nccl need a group first).
  int priority = 0;
  // A one-sided transport that reaches agents on any host (the ucx plugin). A consumer on
  // another host whose ref's transport works on one host only (shm) takes the one of highest
  // priority it has (GetOptions::allow_fallback): it asks the owner to publish the object on it
  // too, and uses the owner's socket stream where the owner cannot, or a get over it fails
  // (TUTTI_TRANSFER_ACROSS_HOSTS; not in TLS unless named there).
  bool across_hosts = false;
};

// Throws Error(kInvalidUsage) for a name already registered or "auto", kInvalidArgument for an
// empty name, a null factory or no devices.
TUTTI_API void register_tensor_transport(TransportInfo info);
// The short form: CPU tensors, priority 0 (below the built-in transports).
TUTTI_API void register_tensor_transport(std::string_view name, TensorTransportFactory factory,
                                         std::function<bool()> available = nullptr);
TUTTI_API bool is_registered_tensor_transport(std::string_view name);
TUTTI_API std::vector<std::string> registered_tensor_transports();

}  // namespace tutti
