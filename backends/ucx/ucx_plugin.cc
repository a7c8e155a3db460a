// The "ucx" tensor transport, a tutti plugin (tutti/plugin.h; libtutti-plugin-ucx.so): one-sided
// gets over UCX (RDMA where the NIC has it; TCP, shared memory or CMA otherwise), for consumers on
// any host.
//
// Owner: its tensors' memory is registered with UCX once per region (a cache of registrations by
// address range: slices of one buffer, or 1,000 views of it, share one), the reference carries
// the owner's UCX worker address, each region's remote key and each tensor's address; a thread
// progresses the owner's worker (serving emulated RMA where the transport needs it). A region
// stays registered while a published object uses it; the agent's lease keeps an object published
// while a consumer reads it, so no get ever reads memory that was given back.
// Consumer: an endpoint per owner (cached; dropped after an error), the remote keys unpacked per
// get, one ucp_get per tensor straight into its target, progressed until all are done, the
// deadline passes (TUTTI_ERR_TIMEOUT) or the get is cancelled (TUTTI_ERR_ABORTED); an owner that
// died fails the get with TUTTI_ERR_IO as soon as UCX sees its endpoint fail.
//
// UCX's own environment applies (UCX_TLS, UCX_NET_DEVICES, ...). Talks to tutti through the C ABI
// only: it links UCX, not tutti.
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tutti/plugin.h>

#include "ucx_blob.h"

namespace {

using namespace tutti_ucx;
using Clock = std::chrono::steady_clock;

tuttiResult_t report(const Failure& f, tuttiError_v1_t* err) {
  std::snprintf(err->message, sizeof(err->message), "ucx: %s", f.what());
  return f.code;
}

void check(ucs_status_t st, const std::string& what, tuttiResult_t code = TUTTI_ERR_IO) {
  if (st != UCS_OK) throw Failure(code, what + ": " + ucs_status_string(st));
}

using RegionKey = std::pair<uintptr_t, uintptr_t>;  // [base, end)

struct Region {
  uintptr_t base = 0;
  size_t size = 0;
  ucp_mem_h memh = nullptr;
  std::string rkey;
  int uses = 0;
};

class Ucx {
 public:
  explicit Ucx(std::string agent) : agent_(std::move(agent)) {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "reading UCX's configuration",
          TUTTI_ERR_UNAVAILABLE);
    // UCX's TCP connects blocking by default: to a host whose firewall drops the packets,
    // ucp_ep_create waited out the kernel's SYN retries (about 2 minutes) under mutex_, past any
    // get's deadline. Non-blocking, the get's own wait bounds it. This context's only (a name
    // UCP does not know goes to its transports; UCX 1.13 matches it without the TCP_ prefix); a
    // UCX_TCP_CONN_NB the user set wins.
    if (std::getenv("UCX_TCP_CONN_NB") == nullptr) {
      const ucs_status_t m = ucp_config_modify(config, "CONN_NB", "y");
      if (m != UCS_OK) ucp_config_release(config);
      check(m, "setting UCX's CONN_NB", TUTTI_ERR_UNAVAILABLE);
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(st, "ucp_init", TUTTI_ERR_UNAVAILABLE);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // every call under mutex_
    check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create", TUTTI_ERR_UNAVAILABLE);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    check(ucp_worker_get_address(worker_, &address, &length), "ucp_worker_get_address");
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    check(ucp_worker_get_efd(worker_, &efd_), "ucp_worker_get_efd");
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    progress_ = std::thread([this] { serve(); });
  }

  ~Ucx() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    idle_.notify_all();
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
    progress_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [address, ep] : eps_) close_ep(*ep);
    for (auto& [base, r] : regions_) ucp_mem_unmap(context_, r.memh);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    ::close(wake_);
  }

  // ---- owner ----

  // The object's ref bytes, its regions registered. `capacity`: the ref's room; a publication
  // that needs more is kept, its size returned in *needed and its bytes for the agent's next call
  // for the same object (plugin.h, TUTTI_BLOB_FIRST), so its regions are registered once.
  std::string publish(uint64_t object, const tuttiTensor_v1_t* tensors, size_t count,
                      size_t capacity, size_t* needed) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = too_large_.find(object); it != too_large_.end()) {
      std::string kept = std::move(it->second);
      too_large_.erase(it);
      if (kept.size() <= capacity) return kept;
      release_locked(objects_.at(object));  // offered less than asked: not the agent's retry
      objects_.erase(object);
    }
    std::vector<RegionKey> used;
    std::vector<uint32_t> index_of(count);
    std::map<RegionKey, uint32_t> region_index;
    std::vector<RegionKey> region_list;
    try {
      const std::vector<RegionKey> runs = runs_of(tensors, count);
      for (size_t i = 0; i < count; ++i) {
        if (tensors[i].nbytes == 0) continue;
        const RegionKey base = region_for(tensors[i], runs[i]);
        const auto [it, added] =
            region_index.emplace(base, static_cast<uint32_t>(region_list.size()));
        if (added) region_list.push_back(base);
        index_of[i] = it->second;
        ++regions_.at(base).uses;
        used.push_back(base);
      }
    } catch (...) {
      release_locked(used);
      throw;
    }
    objects_[object] = used;
    std::vector<const std::string*> rkeys;
    for (const RegionKey& base : region_list) rkeys.push_back(&regions_.at(base).rkey);
    std::vector<Piece> pieces(count);
    for (size_t i = 0; i < count; ++i) {
      pieces[i] = Piece{tensors[i].nbytes == 0 ? UINT32_MAX : index_of[i],
                        reinterpret_cast<uintptr_t>(tensors[i].data), tensors[i].nbytes};
    }
    std::string blob = encode(address_, rkeys, pieces);
    if (blob.size() > capacity) {
      *needed = blob.size();
      too_large_[object] = std::move(blob);
      return {};
    }
    return blob;
  }

  void unpublish(uint64_t object) {
    std::lock_guard<std::mutex> lock(mutex_);
    too_large_.erase(object);
    auto it = objects_.find(object);
    if (it == objects_.end()) return;
    release_locked(it->second);
    objects_.erase(it);
  }

  size_t registrations() {
    std::lock_guard<std::mutex> lock(mutex_);
    return registered_;
  }

  // ---- consumer ----

  void fetch(const void* blob, size_t size, const tuttiTensor_v1_t* targets, size_t count,
             const tuttiPeer_v1_t* owner, Clock::time_point deadline) {
    const Described d = describe(blob, size, targets, count);
    std::unique_lock<std::mutex> lock(mutex_);
    // While it runs, this fetch progresses the worker and waits on its events itself; the serving
    // thread leaves them to it (it would take the events this thread sleeps on).
    struct Fetching {
      Ucx& u;
      explicit Fetching(Ucx& x) : u(x) { ++u.fetching_; }
      ~Fetching() {  // mutex_ held
        if (--u.fetching_ == 0) u.idle_.notify_all();
      }
    } fetching(*this);
    // Kept by this fetch: another one may drop the endpoint from eps_ while this one sleeps.
    const std::shared_ptr<Endpoint> held = endpoint(d.address);
    Gets gets;
    try {
      for (const std::string& rkey : d.rkeys) {
        gets.keys.push_back(nullptr);
        check(ucp_ep_rkey_unpack(held->ep, rkey.data(), &gets.keys.back()),
              "unpacking a remote key");
      }
      for (size_t i = 0; i < d.pieces.size(); ++i) {
        const Piece& piece = d.pieces[i];
        if (piece.bytes == 0) continue;
        ucp_request_param_t param{};
        void* q = ucp_get_nbx(held->ep, targets[i].data, piece.bytes, piece.address,
                              gets.keys[piece.region], &param);
        if (UCS_PTR_IS_ERR(q))
          check(UCS_PTR_STATUS(q), "ucp_get_nbx of tensor " + std::to_string(i));
        gets.requests.push_back(q);
      }
      wait_gets(lock, gets, *held, owner, deadline);
      end_gets(gets, d.address, held.get(), false);
    } catch (...) {
      end_gets(gets, d.address, held.get(), held->failed);
      throw;
    }
  }

 private:
  struct Endpoint {
    ucp_ep_h ep = nullptr;
    bool failed = false;
    std::string why;
  };

  // A fetch's remote keys and operations.
  struct Gets {
    std::vector<ucp_rkey_h> keys;
    std::vector<void*> requests;
  };

  // Until every get is done (returns), failed, cancelled or late (throws). With mutex_ held
  // through `lock`, which it gives up while it sleeps.
  void wait_gets(std::unique_lock<std::mutex>& lock, const Gets& gets, Endpoint& ep,
                 const tuttiPeer_v1_t* owner, Clock::time_point deadline) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(50);
    while (true) {
      ucp_worker_progress(worker_);
      bool done = true;
      for (void* q : gets.requests) {
        if (!UCS_PTR_IS_PTR(q)) continue;
        const ucs_status_t st = ucp_request_check_status(q);
        if (st == UCS_INPROGRESS) {
          done = false;
        } else if (st != UCS_OK) {
          ep.failed = true;
          check(st, "a get from " + std::string(owner->owner->name));
        }
      }
      if (ep.failed) {
        throw Failure(TUTTI_ERR_IO,
                      "the endpoint to " + std::string(owner->owner->name) + " failed: " + ep.why);
      }
      if (done) return;
      if (owner->cancelled(owner->handle)) throw Failure(TUTTI_ERR_ABORTED, "cancelled");
      const auto now = Clock::now();
      if (now >= deadline) {
        ep.failed = true;  // its pending operations are abandoned: a fresh endpoint next time
        throw Failure(TUTTI_ERR_TIMEOUT, "the gets from " + std::string(owner->owner->name) +
                                             " ran past the deadline");
      }
      // A small get is done within tens of microseconds: progress until then; after it, sleep
      // until the worker has an event (armed first, or its event fd stays quiet), looking at the
      // cancel flag and the deadline every 10 ms. (It polled an unarmed fd with a 1 ms timeout,
      // which the serving thread could also drain: 8 B gets took 0.07-4 ms.)
      if (now < spin_until) continue;
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      lock.unlock();
      pollfd p{efd_, POLLIN, 0};
      ::poll(&p, 1, 10);
      lock.lock();
    }
  }

  // Ends a fetch's operations: those still running are cancelled, and on a failed endpoint (an
  // error, or the deadline) the endpoint is closed at once (force), which ends them whatever the
  // peer does; a closed link would otherwise keep them until TCP gives up. No operation touches
  // the targets after this returns. With mutex_ held.
  void end_gets(Gets& gets, const std::string& address, const Endpoint* ep, bool failed) {
    for (void* q : gets.requests) {
      if (UCS_PTR_IS_PTR(q) && ucp_request_check_status(q) == UCS_INPROGRESS) {
        ucp_request_cancel(worker_, q);
      }
    }
    if (failed) drop(address, ep);
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    for (void* q : gets.requests) {
      if (!UCS_PTR_IS_PTR(q)) continue;
      while (ucp_request_check_status(q) == UCS_INPROGRESS && Clock::now() < until) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(q);
    }
    gets.requests.clear();
    for (ucp_rkey_h k : gets.keys) {
      if (k != nullptr) ucp_rkey_destroy(k);
    }
    gets.keys.clear();
  }

  static void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* e = static_cast<Endpoint*>(arg);
    e->failed = true;
    e->why = ucs_status_string(status);
  }

  std::shared_ptr<Endpoint> endpoint(const std::string& address) {
    auto it = eps_.find(address);
    if (it != eps_.end() && !it->second->failed) return it->second;
    if (it != eps_.end()) drop(address, it->second.get());
    auto e = std::make_shared<Endpoint>();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Ucx::on_error;
    params.err_handler.arg = e.get();
    check(ucp_ep_create(worker_, &params, &e->ep), "connecting to the owner");
    eps_[address] = e;
    return e;
  }

  // Closes it at once; a fetch still holding it sees it failed.
  void close_ep(Endpoint& e) {
    if (!e.failed) {
      e.failed = true;
      e.why = "closed after another get over it failed";
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* q = ucp_ep_close_nbx(e.ep, &param);
    if (UCS_PTR_IS_PTR(q)) {
      // Forced: it ends what the endpoint had in flight at once; over a cut link its own
      // completion may never come, so it is waited for a moment only.
      const auto until = Clock::now() + std::chrono::milliseconds(200);
      while (ucp_request_check_status(q) == UCS_INPROGRESS && Clock::now() < until) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(q);
    }
  }

  // Closes and forgets the endpoint to `address` if it is still `which` (a fetch that failed on
  // an endpoint another one has replaced since leaves the new one alone).
  void drop(const std::string& address, const Endpoint* which) {
    auto it = eps_.find(address);
    if (it == eps_.end() || it->second.get() != which) return;
    close_ep(*it->second);
    eps_.erase(it);
  }

  // Per tensor, the run of this object's non-empty tensors that touch or overlap it (transitively:
  // views of one buffer make one run), as [base, end); by one sort of their addresses.
  static std::vector<RegionKey> runs_of(const tuttiTensor_v1_t* tensors, size_t count) {
    std::vector<size_t> order;
    for (size_t i = 0; i < count; ++i)
      if (tensors[i].nbytes != 0) order.push_back(i);
    auto lo = [&](size_t i) { return reinterpret_cast<uintptr_t>(tensors[i].data); };
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return lo(x) < lo(y); });
    std::vector<RegionKey> runs(count);
    for (size_t first = 0; first < order.size();) {
      RegionKey run{lo(order[first]), lo(order[first]) + tensors[order[first]].nbytes};
      size_t last = first + 1;
      for (; last < order.size() && lo(order[last]) <= run.second; ++last)
        run.second = std::max(run.second, lo(order[last]) + tensors[order[last]].nbytes);
      for (size_t k = first; k < last; ++k) runs[order[k]] = run;
      first = last;
    }
    return runs;
  }

  // The registered region holding tensor t: an existing one that covers it, or a new one over its
  // run (one registration for slices of one buffer; a buffer whose slices were registered before
  // gets one of its own, beside theirs). With mutex_ held.
  RegionKey region_for(const tuttiTensor_v1_t& t, RegionKey run) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data);
    const uintptr_t hi = lo + t.nbytes;
    // The regions that begin at or below lo, the ones beginning highest (and among them the
    // longest) first, down to where none is long enough to reach hi.
    for (auto it = regions_.upper_bound(RegionKey{lo, UINTPTR_MAX}); it != regions_.begin();) {
      --it;
      if (hi <= it->first.second) return it->first;
      if (hi - it->first.first > longest_) break;
    }
    // Registered regions it would overlap are left as they are: this one is registered apart.
    const auto [a, b] = run;
    Region r;
    r.base = a;
    r.size = b - a;
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = reinterpret_cast<void*>(a);
    mp.length = r.size;
    check(ucp_mem_map(context_, &mp, &r.memh), "registering " + std::to_string(r.size) + " bytes");
    void* packed = nullptr;
    size_t packed_size = 0;
    const ucs_status_t st = ucp_rkey_pack(context_, r.memh, &packed, &packed_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, r.memh);
      check(st, "packing a remote key");
    }
    r.rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    regions_[RegionKey{a, b}] = r;
    longest_ = std::max(longest_, r.size);
    ++registered_;
    return RegionKey{a, b};
  }

  void release_locked(const std::vector<RegionKey>& bases) {
    for (const RegionKey& base : bases) {
      auto it = regions_.find(base);
      if (it == regions_.end() || --it->second.uses > 0) continue;
      ucp_mem_unmap(context_, it->second.memh);
      regions_.erase(it);
    }
  }

  // Progresses the worker while nothing else does: the owner's side of emulated RMA.
  void serve() {
    while (!stop_) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        idle_.wait(lock, [&] { return fetching_ == 0 || stop_; });
        if (stop_) break;
        while (ucp_worker_progress(worker_) != 0) {
        }
        if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      }
      pollfd p[2] = {{efd_, POLLIN, 0}, {wake_, POLLIN, 0}};
      ::poll(p, 2, 100);
    }
  }

  const std::string agent_;
  std::mutex mutex_;
  int fetching_ = 0;              // fetches running (under mutex_)
  std::condition_variable idle_;  // none is, or the transport stops
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int efd_ = -1;
  int wake_ = -1;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  std::map<RegionKey, Region> regions_;                 // by (base, end) address
  std::map<uint64_t, std::vector<RegionKey>> objects_;  // object -> the regions it uses
  std::map<uint64_t, std::string> too_large_;  // published, its ref bytes not yet taken (publish)
  size_t longest_ = 0;  // the longest region registered so far (region_for's search stops there)
  std::map<std::string, std::shared_ptr<Endpoint>> eps_;  // by the owner's worker address
  size_t registered_ = 0;                                 // registrations made, for tests
};

// ---- the C ABI ----

tuttiResult_t create(void*, const tuttiAgent_v1_t* agent, void** transport, tuttiError_v1_t* err) {
  try {
    *transport = new Ucx(agent->name != nullptr ? agent->name : "");
    return TUTTI_OK;
  } catch (const Failure& f) {
    return report(f, err);
  }
}

void destroy(void* transport) {
  delete static_cast<Ucx*>(transport);
}

tuttiResult_t publish(void* transport, uint64_t object, const tuttiTensor_v1_t* tensors,
                      size_t count, void* blob, size_t* blob_size, tuttiError_v1_t* err) {
  try {
    for (size_t i = 0; i < count; ++i) {
      if (tensors[i].device_type != TUTTI_DEVICE_CPU) {
        throw Failure(TUTTI_ERR_INVALID_ARGUMENT,
                      "tensor " + std::to_string(i) + " is not in CPU memory");
      }
    }
    size_t needed = 0;
    const std::string b =
        static_cast<Ucx*>(transport)->publish(object, tensors, count, *blob_size, &needed);
    if (needed != 0) {
      // Kept for the agent's second call (plugin.h, TUTTI_BLOB_FIRST).
      const size_t capacity = *blob_size;
      *blob_size = needed;
      throw Failure(TUTTI_ERR_INVALID_ARGUMENT, "the reference needs " + std::to_string(needed) +
                                                    " bytes, " + std::to_string(capacity) +
                                                    " offered");
    }
    std::memcpy(blob, b.data(), b.size());
    *blob_size = b.size();
    return TUTTI_OK;
  } catch (const Failure& f) {
    return report(f, err);
  }
}

void unpublish(void* transport, uint64_t object) {
  static_cast<Ucx*>(transport)->unpublish(object);
}

// "registrations": how many regions this transport has registered (tests: a put of many views of
// one buffer registers it once).
tuttiResult_t answer(void* transport, const void* request, size_t size, void* reply,
                     size_t* reply_size, tuttiError_v1_t* err) {
  if (std::string(static_cast<const char*>(request), size) != "registrations") {
    std::snprintf(err->message, sizeof(err->message), "ucx: an unknown request");
    return TUTTI_ERR_INVALID_ARGUMENT;
  }
  const std::string n = std::to_string(static_cast<Ucx*>(transport)->registrations());
  if (n.size() > *reply_size) return TUTTI_ERR_INVALID_ARGUMENT;
  std::memcpy(reply, n.data(), n.size());
  *reply_size = n.size();
  return TUTTI_OK;
}

tuttiResult_t fetch(void* transport, const void* blob, size_t blob_size,
                    const tuttiTensor_v1_t* targets, size_t count, const tuttiPeer_v1_t* owner,
                    int64_t timeout_ms, tuttiError_v1_t* err) {
  try {
    static_cast<Ucx*>(transport)->fetch(blob, blob_size, targets, count, owner,
                                        Clock::now() + std::chrono::milliseconds(timeout_ms));
    return TUTTI_OK;
  } catch (const Failure& f) {
    return report(f, err);
  }
}

int available(void*) {
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return 0;
  ucp_config_release(config);
  return 1;
}

tuttiTransport_v1_t make_ucx() {
  tuttiTransport_v1_t t{};
  t.name = "ucx";
  t.devices = 1u << TUTTI_DEVICE_CPU;
  t.priority = 15;  // "auto": below shm (one host), above socket
  t.cross_host = 1;
  t.available = available;
  t.create = create;
  t.destroy = destroy;
  t.publish = publish;
  t.unpublish = unpublish;
  t.answer = answer;
  t.fetch = fetch;
  return t;
}

const tuttiTransport_v1_t kUcx = make_ucx();
const tuttiTransport_v1_t* const kTransports[] = {&kUcx};

}  // namespace

extern "C" __attribute__((visibility("default"))) const tuttiPlugin_v1_t tuttiPlugin_v1 = {
    "ucx", nullptr, nullptr, nullptr, 0, kTransports, 1,
};
