// The TransferAgent's insides (internal to the direct transport), one file per concept:
// - agent_core.cc: the agent's identity, start and stop;
// - object_table.cc: the owner's objects (publish, fulfil, fail, holds, settling, freeing);
// - object_wait.cc: wait_tensor_freed, what holds an object, the write checks;
// - owner_accept.cc: the owner's listeners and housekeeping (accepting, dropping consumers);
// - owner_server.cc: the connections it serves (handshake.h: the hello);
// - peers.h/.cc: the consumer's owners and its connection pool;
// - consumer.cc / consumer_lease.cc: get and borrow, and the leases they take;
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
#include <tuple>
#include <vector>

#include "transfer/channel.h"
#include "transfer/lease_table.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"
#include "tutti/transfer_agent.h"
#include "tutti/transport_codec.h"

namespace tutti::detail {

class PeerLink;
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
  std::string what;  // "get of object 3 of agent 'a' (shm) on agent 'b'", for wait's timeout
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
  int handles = 0;                             // live ObjectPins (1 from put)
  uint32_t expected_gets = 0;                  // left to complete before it may go
  std::chrono::milliseconds keep_for{0};
  Clock::time_point keep_until{};  // set when the last handle goes
  int local_leases = 0;            // holds the owner keeps itself: streams, own borrows, remote
  std::string failure;             // fail()'s message
  bool check_writes = false;       // PutOptions::check_writes: crcs of the tensors at publication
  std::vector<uint32_t> crcs;
  // Its publications on other transports, made when consumers on other hosts asked (kPublish),
  // by transport name; unpublished as it goes.
  std::map<std::string, std::pair<TensorTransport*, Publication>> also;
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
  // Pooled connections. The agent's housekeeping closes those whose other end hung up while
  // they waited (the owner's agent stopped; across hosts, a reset from anything between), and
  // forgets the peer when all had.
  std::vector<std::unique_ptr<Connection>> idle;
  std::unique_ptr<Lane> lane;
  std::unique_ptr<SlotView> slots;  // set once, under `mutex`
  int pidfd = -1;                   // one host: readable once the owner's process has exited
  // Across hosts (kPublish, under `mutex`): the owner's publications of its objects on this
  // agent's transport for other hosts, by (transport, id, generation), the newest kept; and the
  // transports it could not publish on (not loaded there), asked no more.
  std::map<std::tuple<std::string, uint64_t, uint32_t>, Publication> also;
  std::set<std::string> declined;
  std::set<std::string> proven;  // those a get from this owner has arrived over
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
  std::mutex mutex;                 // everything below up to `peers_mutex`
  std::condition_variable changed;  // an object changed state or went
  std::mutex also_mutex;            // one publish_also at a time (outside `mutex`)
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
  // The threads serving one connection each, by id. One that ends moves its own handle to
  // ended_serving (it cannot join itself); the acceptors and stop() join those, so that no
  // thread is still ending (its destructors, its thread-local storage) when the agent goes or
  // the process exits (LeakSanitizer's exit check crashed on one, 1 run in 120 here).
  std::map<std::thread::id, std::thread> serving_threads;
  std::vector<std::thread> ended_serving;
  std::condition_variable serving_done;
  void serving_thread_ends_locked();  // by the serving thread, last, under `mutex`
  void join_ended_serving();          // outside `mutex`

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

  // ---- get_async's workers (workers.cc) ----
  std::mutex workers_mutex;
  std::condition_variable work_ready;    // a job was queued, or the workers must go
  std::condition_variable workers_gone;  // a worker left
  // A job runs a get and returns what publishes its result (called once the worker is idle).
  std::deque<std::function<std::function<void()>()>> jobs;
  // Each leaves when idle long or at stop, moving its own handle to ended_workers, which the
  // next run_async and stop_workers join (as the serving threads, above).
  std::vector<std::thread> workers;
  std::vector<std::thread> ended_workers;
  size_t idle_workers = 0;
  bool workers_stop = false;

  uint64_t fork_gen = 0;  // the fork generation this agent was made in

  explicit AgentCore(const TransferAgentOptions& options);
  ~AgentCore();
  void start();
  void stop();
  // In a child forked from the process that made this agent: its threads stayed in the parent,
  // and its slot page and lanes are shared with it. Nothing there may touch them.
  bool forked() const;
  // kInvalidUsage naming the op in a forked child.
  void check_process(const char* op) const;

  TensorTransport& transport(const std::string& name);
  // PutOptions::transport as a registry key: "auto" is the available transport of highest
  // priority that carries `device`'s tensors (TransportInfo::priority).
  std::string resolve_transport(const std::string& requested, DeviceType device) const;
  std::string who() const;  // "agent 'x'"

  // ---- the owner's objects (object_table.cc, object_wait.cc) ----
  ObjectHandle publish(const std::vector<TensorView>& tensors, const std::vector<TensorMeta>& metas,
                       const PutOptions& options, bool reserved);
  void fulfil(uint64_t id, const std::vector<TensorView>& tensors);
  void fail(uint64_t id, std::string_view message);
  void drop_pin(uint64_t id);
  void wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout);
  // Under `mutex`: a free slot for a new object (kUnavailable when all are live).
  uint32_t take_slot_locked();
  // Under `mutex`: object `id` of generation `gen`, or kInvalidUsage saying when it was freed.
  Object& find_locked(uint64_t id, uint32_t gen);
  // Under `mutex`: waits until object `id` of `gen` is no longer reserved (or gone, or the agent
  // stops) or the deadline passes, in slices of at most 50 ms, calling `each_slice` (which may
  // throw: a cancelled get, a consumer that hung up) after each.
  void await_fulfilled_locked(std::unique_lock<std::mutex>& lock, uint64_t id, uint32_t gen,
                              Clock::time_point deadline,
                              const std::function<void()>& each_slice = nullptr);
  // A transfer's hold at the owner: waits (up to `deadline`) while the object is reserved, then
  // keeps it live until release_hold; throws unless it can be served (still reserved, failed,
  // being freed, gone, or published on another transport than `on` where one is given).
  // `each_slice` as for await_fulfilled_locked.
  std::vector<TensorView> hold(uint64_t id, uint32_t gen, Clock::time_point deadline,
                               const TensorTransport* on = nullptr,
                               const std::function<void()>& each_slice = nullptr);
  // Ends a hold; `counted`: the transfer completed one of the object's expected gets.
  void release_hold(uint64_t id, bool counted);
  // Under `mutex`: one of the object's expected gets completed.
  void count_get_locked(Object& o);
  // Under `mutex`: retire what nothing pins, free what nothing holds.
  void settle_locked(Object& o);
  void settle_all_locked();
  void free_locked(std::map<uint64_t, Object>::iterator it);
  bool leased_by_a_lane_locked(const Object& o, std::string* who = nullptr) const;
  // Under `mutex`, as an object goes: whether the owner wrote to it while it was published
  // (PutOptions::check_writes), kept for the next wait_tensor_freed over its bytes.
  void check_writes_locked(const Object& o);
  std::string freed_text_locked(uint64_t id) const;
  std::string blockers_locked(const Object& o) const;
  // A consumer on another host asks (kPublish): object `id` of `gen` published on transport
  // `name` too (the publication made for an earlier consumer where there is one); a hold waits
  // while it is reserved, up to `deadline`. The object's state errors are thrown, as for a
  // lease; the transport's are told in the answer. `each_slice` as for await_fulfilled_locked
  // (across_hosts.cc).
  struct AlsoPublished {
    enum Status : uint8_t {
      kPublished = 0,      // + the publication
      kNotHere = 1,        // the transport is not loaded (or cannot start) here: ask no more
      kNotThisObject = 2,  // it cannot publish this object (CUDA tensors, a failed registration)
    };
    Status status = kPublished;
    Publication pub;
    size_t tensors = 0;
    std::string why;
  };
  AlsoPublished publish_also(uint64_t id, uint32_t gen, const std::string& name,
                             Clock::time_point deadline, const std::function<void()>& each_slice);
  // The owner's answer to kPublish (id, generation, transport, timeout): a status, then the
  // publication or why not.
  std::string answer_publish(WireReader& request, const std::function<void()>& each_slice);

  // ---- the owner's server (owner_server.cc; its listeners and housekeeping: owner_accept.cc) ----
  void accept_loop(int listener, bool local);
  // One accepted connection: refused (another uid) or handed to a serving thread of its own;
  // false once the agent stops.
  bool take_connection(int fd, bool local);
  void serve(std::unique_ptr<Connection> connection, bool local);
  void housekeeping_loop();
  // Under `mutex`: forgets a consumer, and the holds it had (its process is gone, or it is
  // remote and its last connection closed).
  void drop_consumer_locked(const std::string& uuid);
  // Under `mutex`: drops the local consumers with no connection whose process has exited.
  void reap_consumers_locked();

  // A transport's holds (TransportOwner::hold) on objects published on `t`.
  HeldObject hold_for(const TensorTransport& t, ObjectId object, Clock::time_point deadline);

  // ---- the consumer's owners (peers.cc) ----
  std::shared_ptr<Peer> peer_for(const AgentIdentity& owner, bool local);
  std::unique_ptr<Connection> checkout(Peer& peer, Clock::time_point deadline,
                                       const std::atomic<bool>* cancelled);
  void checkin(Peer& peer, std::unique_ptr<Connection> connection);
  void abort_gets();
  // Forgets the owners whose process has exited (their lanes, mappings, sockets and pidfds), or
  // whose agent hung up every pooled connection; closes pooled connections that hung up. The
  // housekeeping thread's (next_idle_look is its own).
  void reap_peers();
  Clock::time_point next_idle_look{};

  // ---- get and borrow (consumer.cc, consumer_lease.cc) ----
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
  // ---- across hosts: the consumer (across_hosts.cc) ----
  // A ref whose transport cannot reach this agent, with allow_fallback, resolved to the owner's
  // socket stream, or, on another host, to a one-sided transport for other hosts this agent has
  // (across_hosts_transport) that its owner was not found without.
  void choose_across(Resolved& r);
  // For such a transport (Resolved::republish): asks the owner to publish the object on it
  // (kPublish; the answer kept per owner) and takes that publication; where the owner cannot,
  // the socket stream (that owner asked no more where the transport is not there).
  void publish_across(Resolved& r, PeerLink& link, Clock::time_point deadline);
  // After a get or borrow over such a transport failed with `e`: true when it should be made
  // again over the socket stream (r now resolved to it; the owner asked no more), within the
  // deadline and not cancelled.
  bool retry_on_socket(Resolved& r, const Error& e, Clock::time_point deadline,
                       const std::atomic<bool>& cancelled);
  // The deadline of the transfer over such a transport (the lease and the fetch; the agents'
  // requests keep the get's): the get's, or, for the first get over it from this owner
  // (Resolved::trial), half the time left once the owner published it, so that a transport that
  // cannot reach the owner and fails slowly (a firewall dropping its packets) leaves the socket
  // stream the other half. A first get that legitimately needs more than half (a large object
  // on a slow link, a short timeout) is made over the stream too, and that owner is not asked
  // for the transport again.
  Clock::time_point trial_until(Resolved& r, Clock::time_point deadline);
  // The bytes of a get over it are here: a later failure is not the transport's, which is now
  // proven with this owner.
  void arrived(Resolved& r);
  Received get_resolved(Resolved& r, const GetOptions& options, Clock::time_point deadline,
                        std::atomic<bool>& cancelled);
  Lease take_lease(Resolved& r, PeerLink& link, Clock::time_point deadline,
                   const std::atomic<bool>& cancelled);
  void end_lease(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease, bool completed);
  void count_get(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease);
  std::pair<Received, std::unique_ptr<HeldLease>> get_own(const TensorRef& ref,
                                                          const std::vector<TensorView>& targets,
                                                          bool borrow, Clock::time_point deadline,
                                                          const std::atomic<bool>& cancelled);
  // Copies the object into `targets` by the resolved road: the owner's stream (socket), the
  // transport's group (two-sided), or the transport itself inside a lease.
  void copy_into(Resolved& r, PeerLink& link, const std::vector<TensorView>& targets,
                 Clock::time_point deadline, const std::atomic<bool>& cancelled, void* stream);
  // Views of the object by the resolved road, held by the returned lease: the owner's memory
  // where the transport can lend it (privately mapped when `writable`), else a copy of the
  // agent's (held like a borrow). Counted as a get.
  struct Lent {
    std::vector<TensorView> views;
    std::unique_ptr<HeldLease> lease;
    bool shares_owner_memory = false;
  };
  Lent lend(Resolved& r, PeerLink& link, bool writable, Clock::time_point deadline,
            const std::atomic<bool>& cancelled, void* stream);
  Received get(const TensorRef& ref, const GetOptions& options,
               const std::atomic<bool>* cancelled = nullptr);
  Borrowed borrow(const TensorRef& ref, const GetOptions& options);
  Fetch get_async(const TensorRef& ref, const GetOptions& options);

  // ---- get_async's workers (workers.cc) ----
  // Runs `job` on an idle worker, or on a new one when none is idle; kAborted once stopping.
  void run_async(std::function<std::function<void()>()> job);
  void worker_loop();
  // In stop(): the workers finish what is queued (gets that fail at once: the agent stops) and
  // leave; one still running after `grace` (a get that ignores its cancel flag) is left to end
  // on its own, holding the agent's state.
  void stop_workers(std::chrono::milliseconds grace);
};

// A transport's name as the registry keys it (lower case).
std::string transport_key(std::string_view name);
// Whether the registry holds `name`, available here or not (a plugin may not take it).
bool transport_name_taken(std::string_view name);
// "auto"'s choice for tensors on `device` (transport_registry.cc); kUnavailable when none.
std::string auto_transport(DeviceType device);
// For a consumer on another host whose ref's transport cannot reach it: this process's available
// transport (TransportInfo::across_hosts) of highest priority carrying `device`'s tensors, or ""
// for the socket stream (none; TUTTI_TRANSFER_ACROSS_HOSTS=socket; or, unless that variable
// names a transport, `tls`: the socket stream is the road in TLS).
std::string across_hosts_transport(DeviceType device, bool tls);
// Whether `name` is an available transport for other hosts carrying CPU tensors.
bool is_across_hosts_transport(const std::string& name);
// TUTTI_TRANSFER_ACROSS_HOSTS as a registry key: "auto" where unset or empty.
std::string across_hosts_setting();

// Joins threads that have ended (serving threads, get_async's workers: past their last lock),
// emptying `ended`; the calling thread's own handle, never expected there, is detached.
void join_ended(std::vector<std::thread>& ended);

// PutOptions::check_writes: a CRC32C per CPU tensor (0 for the others).
std::vector<uint32_t> checksums(const std::vector<TensorView>& tensors);
// PutOptions::snapshot: copies of `tensors`, in the transport's shareable memory where it has any.
std::vector<TensorView> snapshot_copy(TensorTransport& t, const std::vector<TensorView>& tensors,
                                      std::vector<std::shared_ptr<void>>& storage);

}  // namespace tutti::detail
