// TransferAgent: the direct tensor transport (Ray's RDT, without an actor runtime).
//
// An owner publishes tensors in place with put() and hands the returned reference
// (TensorRef, tutti/tensor_ref.h) to any peer by any means; the peer's agent resolves it with
// get() (a copy into the caller's targets or into buffers it allocates) or borrow() (a zero-copy,
// read-only view of the owner's memory, where the transport allows). Transports:
// - "shm" (one host, tutti::shm): the consumer reads the owner's memory itself: zero-copy from
//   the agent's shareable arena (allocate()), one copy by cross-memory read elsewhere, or a
//   snapshot taken at put (PutOptions::snapshot).
// - "cuda_ipc" (one host, tutti::cuda_ipc): CUDA tensors, exported per allocation with CUDA IPC;
//   the consumer copies device to device, or borrows views of the owner's GPU memory.
// - "socket" (built in, any host): the owner streams the bytes over the agents' connection.
// - "gloo" (and "nccl" for CUDA tensors), two-sided, any host: the owner sends, the consumer
//   receives, over a dedicated CollectiveGroup of the agents (join_group / attach_group): each
//   pair of agents that transfer splits a two-rank group off it, which one thread per pair
//   drives with batched send/recv. A failure there aborts only those groups:
//   later gets of the transport fail with kAborted until every member calls reset_transport.
// - custom ones (tutti/tensor_transport.h).
// "auto" takes the available transport of highest priority that carries the tensors' device
// (TransportInfo::priority): shm for CPU tensors where tutti::shm is linked, else socket; cuda_ipc
// for CUDA tensors where tutti::cuda_ipc is linked and a GPU is visible.
//
// Lifetime: an object lives while a copy of its ObjectHandle does, then until `expected_gets`
// gets have completed and `keep_for` has passed, then until no consumer holds it (a copy in
// progress, or a borrow not released). A consumer that dies releases what it held at once.
// wait_tensor_freed(t) on the owner waits until every object overlapping t's bytes is freed.
//
// Threads: every method may be called from any thread, concurrently.
// Errors (tutti::Error; every message names the agent, the object, the transport and the peer):
// kInvalidArgument before any I/O for bad refs, targets or devices; kInvalidUsage for a freed
// object; kUnavailable for an unknown transport or a one-host ref used on another host;
// kRemoteError for the owner's fail(); kIoError when the owner died; kTimeout at the get's
// timeout (GetOptions::timeout, else TUTTI_RDT_FETCH_TIMEOUT_MS, default 60000);
// kAborted after cancel() or abort().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/error.h"
#include "tutti/export.h"
#include "tutti/options.h"
#include "tutti/store.h"
#include "tutti/tensor_ref.h"
#include "tutti/tensor_view.h"

namespace tutti {

class CollectiveGroup;

struct PutOptions {
  std::string transport = "auto";  // "auto": see above (shm, socket, cuda_ipc by device)
  bool snapshot = false;       // copy now: later writes to the tensors are not seen by consumers
  uint32_t expected_gets = 0;  // after the last handle: live until this many gets completed
  std::chrono::milliseconds keep_for{0};  // after the last handle: live at least this long
  // CUDA tensors (cuda_ipc): the producer's cudaStream_t; consumers' reads are ordered after the
  // work queued on it so far. Null: the legacy default stream.
  void* stream = nullptr;
  // Debugging (also TUTTI_RDT_CHECK=1): a checksum of the CPU tensors at put, compared when the
  // object is freed; a difference means the owner wrote to them while they were published, and
  // the owner's next wait_tensor_freed covering them fails with kRemoteError saying so.
  bool check_writes = false;
};

struct GetOptions {
  // get(): receive into these (one per tensor, same dtype and size, on the CPU); empty: get
  // allocates. Checked before any I/O.
  std::vector<TensorView> targets;
  // 0: TUTTI_RDT_FETCH_TIMEOUT_MS, else 60000.
  std::chrono::milliseconds timeout{0};
  // A one-host transport's ref used on another host (or network or pid namespace): instead of
  // failing with kUnavailable, on another host the owner publishes the object on a one-sided
  // transport for other hosts that both agents have (the ucx plugin loaded on both:
  // TransportInfo::across_hosts, TUTTI_TRANSFER_ACROSS_HOSTS), else "socket": the owner's stream.
  // Received::transport() says which carried the bytes.
  bool allow_fallback = false;
  // get() without targets: tensors the owner's transport can map (shm: memory from allocate(), or
  // registered with its file) come as private copy-on-write mappings of the owner's pages instead
  // of copies: no byte moves until the caller writes a page, which then becomes its own (the
  // owner and other consumers never see it). The Received then holds the object at the owner, as
  // a borrow does, until it is destroyed. Other tensors are copied as usual. Own refs: a copy.
  bool copy_on_write = false;
  // CUDA tensors (cuda_ipc): the consumer's cudaStream_t. A get's copy and a borrow's views are
  // ordered on it after the producer's work; null: the host waits for the producer instead, and
  // a get's copy also waits for the work queued on the device's legacy default stream (where
  // the caller's writes to the targets are then).
  void* stream = nullptr;
};

namespace detail {
struct AgentCore;
struct ObjectPin;
struct HeldLease;
struct FetchState;
}  // namespace detail

// The owner's handle on a published object (Ray's ObjectRef at the owner). Copies share one
// pin; the object may be freed once every copy was released or destroyed.
class TUTTI_API ObjectHandle {
 public:
  ObjectHandle() = default;
  const TensorRef& ref() const;
  // This copy stops pinning the object. Idempotent.
  void release();
  explicit operator bool() const { return pin_ != nullptr; }

 private:
  friend struct detail::AgentCore;
  explicit ObjectHandle(std::shared_ptr<detail::ObjectPin> pin) : pin_(std::move(pin)) {}
  std::shared_ptr<detail::ObjectPin> pin_;
};

// get()'s result. Owns its buffers, unless the caller gave targets (then its views are those)
// or the ref was this agent's own (then they are the owner's tensors, no copy). Its tensors under
// 4 MiB share one allocation (a thousand small tensors: one buffer to map and fault, kept for
// the next get of the same tensors as large buffers are: TUTTI_TRANSFER_KEEP_MB).
class TUTTI_API Received {
 public:
  Received() = default;
  const std::vector<TensorView>& tensors() const { return views_; }
  // The transport that carried the bytes: the ref's, or the one a fallback took ("socket", or
  // on another host one both agents have, e.g. "ucx"; GetOptions::allow_fallback).
  const std::string& transport() const { return transport_; }

 private:
  friend struct detail::AgentCore;
  std::vector<TensorView> views_;
  std::vector<std::shared_ptr<void>> storage_;
  std::string transport_;
};

// borrow()'s result: read-only views of the owner's memory, valid until release() (or the
// destructor). The owner cannot free the object meanwhile. Views stay readable even if the owner
// dies. Movable, not copyable.
class TUTTI_API Borrowed {
 public:
  Borrowed();  // out of line: HeldLease is complete only in the library
  Borrowed(Borrowed&&) noexcept;
  Borrowed& operator=(Borrowed&&) noexcept;
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  ~Borrowed();

  const std::vector<TensorView>& tensors() const { return views_; }
  void release() noexcept;

 private:
  friend struct detail::AgentCore;
  std::vector<TensorView> views_;
  std::unique_ptr<detail::HeldLease> lease_;
};

// An asynchronous get (get_async), with Work's verbs. It runs on one of the agent's workers
// (threads reused from get to get, as many as gets run at once). Every method may be called from
// any thread, any number of times.
class TUTTI_API Fetch {
 public:
  Fetch() = default;
  // True once the get has finished, successfully or not (an empty Fetch: true). Never blocks.
  bool is_completed() const;
  bool done() const { return is_completed(); }  // is_completed's name before 0.1's Work verbs
  // Waits until the get has finished and returns what it received, or rethrows its error.
  // kUseGroupTimeout (the default) waits as long as the get may take (its own timeout bounds
  // it); a shorter timeout that passes first throws Error(kTimeout) saying the get still runs,
  // and leaves it running: wait() may be called again.
  Received wait(std::chrono::milliseconds timeout = kUseGroupTimeout);
  // The get's error; null while it runs or after it succeeded.
  std::exception_ptr exception() const;
  void cancel() noexcept;  // the get ends with kAborted; the agent stays usable

 private:
  friend struct detail::AgentCore;
  std::shared_ptr<detail::FetchState> state_;
};

struct TransferAgentOptions {
  std::string name;                            // in messages; default "<host>:<pid>"
  std::chrono::milliseconds fetch_timeout{0};  // 0: TUTTI_RDT_FETCH_TIMEOUT_MS, else 60000
  bool listen_tcp = false;  // serve consumers on other hosts (the socket transport)
  // The address to listen on and publish; default the host name when it resolves to other than
  // loopback, else the first IPv4 address of an interface that is up.
  std::string tcp_host;
  // Refs are signed with this and only signed refs are accepted (default TUTTI_TRANSFER_SECRET,
  // else TUTTI_STORE_SECRET).
  std::string secret;
  // Connections between hosts (the socket transport, TCP) in TLS 1.3, keyed by `secret`
  // (required): its bytes are then private and authenticated on the network. Every agent of
  // the job must agree (a mismatch fails the get naming it). Default TUTTI_TRANSFER_TLS=1.
  // Connections on one host (Unix sockets, shm, cuda_ipc) are unaffected.
  bool tls = false;
};

class TUTTI_API TransferAgent {
 public:
  static std::shared_ptr<TransferAgent> create(const TransferAgentOptions& options = {});
  ~TransferAgent();

  const AgentIdentity& identity() const;

  // Publishes tensors in place (no copy where the transport allows). The tensors must stay
  // alive and unchanged until the object is freed (see wait_tensor_freed), unless snapshot.
  ObjectHandle put(const std::vector<TensorView>& tensors, const PutOptions& options = {});
  // A ref now, the data later: gets wait (up to their timeout) until fulfil() or fail(). The
  // owner stops waiting a little before a get's timeout (a quarter of what was left when it
  // asked, at most 500 ms), so that the get's kTimeout says the object is still reserved.
  ObjectHandle reserve(const std::vector<TensorMeta>& metas, const PutOptions& options = {});
  void fulfil(const ObjectHandle& handle, const std::vector<TensorView>& tensors);
  // Gets of the object, waiting or later, fail with kRemoteError carrying `message`.
  void fail(const ObjectHandle& handle, std::string_view message);

  Received get(const TensorRef& ref, const GetOptions& options = {});
  Borrowed borrow(const TensorRef& ref, const GetOptions& options = {});
  Fetch get_async(const TensorRef& ref, const GetOptions& options = {});

  // On the owner: waits until every object whose tensors overlap `tensor`'s bytes is freed.
  // kTimeout lists what still holds each: owner handles, expected gets, keep_for, consumers.
  void wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout);

  // CPU memory that transports can share without copying (shm: zero-copy gets and borrows), a
  // 1-D view of bytes / dtype_size(dtype) elements. Give it back with deallocate() (or it goes
  // with the agent). Throws kUnavailable when no registered transport offers any.
  TensorView allocate(size_t bytes, DType dtype = DType::kUInt8);
  void deallocate(const TensorView& memory);

  // Makes the caller's CPU memory shareable once, so that puts of tensors inside it are cheap and
  // (with an fd) zero-copy: `fd` is the file the region is mapped MAP_SHARED from (a memfd, a
  // /dev/shm file: e.g. a tensor moved to shared memory), at `fd_offset` (page-aligned, like
  // region.data()); shm consumers then map it read-only (through a read-only descriptor) and
  // borrow it in place. Without an fd, shm gets copy it by cross-memory read. The agent keeps
  // its own descriptor; the caller keeps the memory alive until unregister_memory, which fails
  // with kInvalidUsage while an object in it is still published.
  void register_memory(const TensorView& region, int fd = -1, uint64_t fd_offset = 0);
  void unregister_memory(const TensorView& region);

  // Fails every get in progress with kAborted; the agent stays usable. Never throws.
  void abort() noexcept;

  // Two-sided transports ("gloo", "nccl"): the group their bytes travel over, one per transport
  // and agent, used by nothing else. join_group makes it (collective: every member calls it with
  // its rank and a store they share; its name is "<set>.<transport>#<incarnation>"), attach_group
  // takes the application's (use it for nothing else: a failed transfer aborts it). Transfers
  // travel on a two-rank group per pair of agents, split off it (SplitOptions::local) by the
  // pair's first transfer. A process outside
  // the group that gets such a ref fails with kInvalidUsage (or, with allow_fallback, uses the
  // socket transport).
  void join_group(std::string_view transport, int world_size, int rank, const GroupOptions& options,
                  std::string_view set = "rdt");
  void attach_group(std::string_view transport, std::shared_ptr<CollectiveGroup> group);
  // After a two-sided failure (the group is aborted and gets fail with kAborted): destroys the
  // group and joins its next incarnation (collective: every member calls it). Objects and refs
  // stay valid. kInvalidUsage for a group given by attach_group (attach a new one instead).
  void reset_transport(std::string_view transport);
  // The group of a two-sided transport, or null.
  std::shared_ptr<CollectiveGroup> transport_group(std::string_view transport);

 private:
  friend struct detail::AgentCore;
  explicit TransferAgent(std::shared_ptr<detail::AgentCore> core);
  std::shared_ptr<detail::AgentCore> core_;
};

// Ray's names, over a process-wide agent made on first use (options from the environment:
// TUTTI_TRANSFER_LISTEN_TCP, TUTTI_TRANSFER_SECRET or TUTTI_STORE_SECRET, TUTTI_TRANSFER_TLS).
TUTTI_API std::shared_ptr<TransferAgent> default_agent();
// Whether default_agent() has made it yet (its options can no longer change).
TUTTI_API bool default_agent_made();
TUTTI_API ObjectHandle put(const std::vector<TensorView>& tensors, const PutOptions& options = {});
TUTTI_API Received get(const TensorRef& ref, const GetOptions& options = {});
TUTTI_API void wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout);

}  // namespace tutti
