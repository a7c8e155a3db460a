// The TransferAgent's insides (internal to the direct transport): the owner's object table and
// the connections it serves (agent_owner.cc), the consumer's peers and gets (agent_consumer.cc).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transfer/channel.h"
#include "transfer/lease_table.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"
#include "tutti/transfer_agent.h"

namespace tutti::detail {

class PeerLink;
class WireReader;
class GroupTransport;

// The pin that ObjectHandle copies share: the object may go once it is destroyed.
struct ObjectPin {
  std::weak_ptr<AgentCore> core;
  uint64_t id = 0;
  TensorRef ref;
  ~ObjectPin();
};

// A consumer's hold on an object, ended exactly once (by release or destruction).
struct HeldLease {
  std::function<void()> end;
  ~HeldLease() {
    if (end) end();
  }
};

struct FetchState {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  Received result;
  std::exception_ptr error;
  std::atomic<bool> cancelled{false};
};

// An object in the owner's table.
struct Object {
  uint64_t id = 0;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t state = kSlotReserved;  // as the slot says (kSlotRetiring once nothing pins it)
  std::vector<TensorMeta> metas;
  std::vector<TensorView> tensors;
  std::string transport;
  TensorTransport* t = nullptr;
  TensorRef ref;
  Publication publication;
  bool published = false;
  bool fulfilling = false;  // a fulfil() is publishing it
  bool snapshot = false;
  std::vector<std::shared_ptr<void>> storage;  // snapshot copies
  int handles = 0;                 // live ObjectPins (1 from put)
  uint32_t expected_gets = 0;      // left to complete before it may go
  std::chrono::milliseconds keep_for{0};
  Clock::time_point keep_until{};  // set when the last handle goes
  int local_leases = 0;            // holds the owner keeps itself: streams, own borrows, remote
  std::string failure;             // fail()'s message
  bool check_writes = false;       // PutOptions::check_writes: crcs of the tensors at publication
  std::vector<uint32_t> crcs;
};

// An object the owner wrote to while it was published (PutOptions::check_writes).
struct WriteViolation {
  std::vector<TensorView> tensors;
  std::string text;
};

// A consumer agent that connected to this owner.
struct Consumer {
  AgentIdentity identity;
  std::unique_ptr<LaneView> lane;  // on this host
  int pidfd = -1;                  // on this host: readable once the consumer's process exited
  int connections = 0;
  std::map<uint64_t, int> leases;  // held through kLease (no lane): object id -> count
};

// An owner agent this agent gets from.
struct Peer {
  AgentIdentity owner;
  bool local = false;  // one host: a Unix socket, a lease lane, the owner's slot page
  std::mutex mutex;
  std::vector<std::unique_ptr<Connection>> idle;
  std::unique_ptr<Lane> lane;
  std::unique_ptr<SlotView> slots;            // set once, under `mutex`
  int pidfd = -1;  // one host: readable once the owner's process has exited
  ~Peer();
  // The owner's slot page once a connection brought it (set once, under `mutex`), or null.
  SlotView* slot_view() {
    std::lock_guard<std::mutex> lock(mutex);
    return slots.get();
  }
  // One host: whether the owner's process has exited (one poll, no blocking).
  bool owner_exited() const;
};

struct AgentCore : std::enable_shared_from_this<AgentCore> {
  AgentIdentity identity;
  TransferAgentOptions options;
  std::chrono::milliseconds fetch_timeout{60000};
  // With options.tls: the owner's and the consumer's side of its TCP connections (util/tls.h).
  std::shared_ptr<SSL_CTX> tls_server, tls_client;

  // ---- owner ----
  std::mutex mutex;  // everything below up to `peers_mutex`
  std::condition_variable changed;  // an object changed state or went
  SlotPage slots;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  std::map<uint64_t, Object> objects;
  uint64_t next_id = 1;
  std::deque<std::pair<uint64_t, Clock::time_point>> freed;  // recently freed ids
  std::deque<WriteViolation> violations;  // reported by the next wait_tensor_freed over them
  bool check_writes_env = false;          // TUTTI_RDT_CHECK=1
  std::map<std::string, std::shared_ptr<Consumer>> consumers;  // by uuid
  std::set<int> serving_fds;  // connections being served (shut down at the end)
  int serving_threads = 0;
  std::condition_variable serving_done;

  int unix_listener = -1;
  int tcp_listener = -1;
  std::vector<std::thread> acceptors;
  std::thread housekeeper;
  std::atomic<bool> stopping{false};

  // ---- transports ----
  std::mutex transports_mutex;
  std::map<std::string, std::unique_ptr<TensorTransport>> transports;

  // ---- consumer ----
  std::mutex peers_mutex;
  // By owner id and whether the link is local (a Unix socket) or TCP.
  std::map<std::pair<std::array<uint8_t, 16>, bool>, std::shared_ptr<Peer>> peers;
  std::mutex active_mutex;
  std::vector<std::atomic<bool>*> active;  // cancel flags of gets in progress

  uint64_t fork_gen = 0;  // the fork generation this agent was made in

  explicit AgentCore(const TransferAgentOptions& options);
  void start();
  void stop();
  // In a child forked from the process that made this agent: its threads stayed in the parent,
  // and its slot page and lanes are shared with it. Nothing there may touch them.
  bool forked() const;
  // kInvalidUsage naming the op in a forked child.
  void check_process(const char* op) const;

  TensorTransport& transport(const std::string& name);
  std::string resolve_transport(const std::string& requested) const;
  std::string who() const;  // "agent 'x'"

  // Owner side (agent_owner.cc).
  ObjectHandle publish(const std::vector<TensorView>& tensors, const std::vector<TensorMeta>& metas,
                       const PutOptions& options, bool reserved);
  void fulfil(uint64_t id, const std::vector<TensorView>& tensors);
  void fail(uint64_t id, std::string_view message);
  void drop_pin(uint64_t id);
  void wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout);
  // Under `mutex`: retire what nothing pins, free what nothing holds.
  void settle_locked(Object& o);
  void settle_all_locked();
  void free_locked(std::map<uint64_t, Object>::iterator it);
  bool leased_by_a_lane_locked(const Object& o, std::string* who = nullptr) const;
  std::string freed_text_locked(uint64_t id) const;
  std::string blockers_locked(const Object& o) const;
  void serve_fetch(WireReader& r, const std::function<void(const std::string&)>& reply,
                   const AgentIdentity& consumer);
  void accept_loop(int listener, bool local);
  void serve(std::unique_ptr<Connection> connection, bool local);
  void housekeeping_loop();
  // Under `mutex`: forgets a consumer, and the holds it had (its process is gone, or it is
  // remote and its last connection closed).
  void drop_consumer_locked(const std::string& uuid);
  // Under `mutex`: drops the local consumers with no connection whose process has exited.
  void reap_consumers_locked();

  // Consumer side (agent_consumer.cc).
  struct Resolved;
  struct Lease {
    int entry = -1;       // in the lane (one host)
    bool remote = false;  // held by the owner for us (kLease)
  };
  Resolved resolve(const TensorRef& ref, const GetOptions& options, const char* op);
  // kInvalidArgument unless the ref carries this agent's signature (when it has a secret).
  void verify_own(const TensorRef& ref, const char* op) const;
  // "get of object 3 of agent 'a' (shm) on agent 'b'": built only for a message.
  std::string context(const char* op, const TensorRef& ref) const;
  Lease take_lease(Resolved& r, PeerLink& link, Clock::time_point deadline,
                   const std::atomic<bool>& cancelled);
  void end_lease(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease, bool completed);
  void count_get(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease);
  std::pair<Received, std::unique_ptr<HeldLease>> get_own(const TensorRef& ref,
                                                          const std::vector<TensorView>& targets,
                                                          bool borrow, Clock::time_point deadline,
                                                          const std::atomic<bool>& cancelled);
  Received get(const TensorRef& ref, const GetOptions& options,
               const std::atomic<bool>* cancelled = nullptr);
  // Two-sided: the owner sends `targets` over the transport's group.
  void get_two_sided(Resolved& r, PeerLink& link, const std::vector<TensorView>& targets,
                     Clock::time_point deadline, const std::atomic<bool>& cancelled);
  Borrowed borrow(const TensorRef& ref, const GetOptions& options);
  Fetch get_async(const TensorRef& ref, const GetOptions& options);
  std::shared_ptr<Peer> peer_for(const AgentIdentity& owner, bool local);
  std::unique_ptr<Connection> checkout(Peer& peer, Clock::time_point deadline,
                                       const std::atomic<bool>* cancelled);
  void checkin(Peer& peer, std::unique_ptr<Connection> connection);
  void abort_gets();
  // Forgets the owners whose process has exited (their lanes, mappings, sockets and pidfds).
  void reap_peers();

  // Messages of this agent's wire protocol.
  static std::string encode_identity(const AgentIdentity& id);
  static AgentIdentity decode_identity(const std::string& bytes);
  // The hello's proofs of the shared secret: the consumer's ("consumer") and the owner's
  // ("owner"), each an HMAC over its role, both agents' ids and both sides' fresh nonces, so that
  // neither can be replayed on another connection or sent back as the other's.
  static std::string hello_proof(const std::string& secret, const char* role,
                                 const AgentIdentity& owner, const AgentIdentity& consumer,
                                 const std::string& owner_nonce, const std::string& consumer_nonce);
};

// 64-byte aligned heap bytes.
std::shared_ptr<void> allocate_bytes(size_t bytes);
// PutOptions::snapshot: copies of `tensors`, in the transport's shareable memory where it has any.
std::vector<TensorView> snapshot_copy(TensorTransport& t, const std::vector<TensorView>& tensors,
                                      std::vector<std::shared_ptr<void>>& storage);

// Ends a reply with an error the other side rethrows: code and message.
std::string error_payload(const Error& e);
[[noreturn]] void throw_error_payload(const std::string& payload);

}  // namespace tutti::detail
