// The NCCL backend's machinery: its life, communicators, launching an op, the watchdog and
// failure. The ops themselves are in nccl_collectives.cc and nccl_p2p.cc.
#include "nccl_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "nccl_api.h"
#include "nccl_types.h"
#include "nccl_util.h"
#include "tutti/error.h"
#include "util/host_identity.h"
#include "util/logging.h"

namespace tutti::nccl_backend {
namespace {

using Clock = std::chrono::steady_clock;

std::string pci_bus_id(int device) {
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    return "cuda:" + std::to_string(device);
  }
  return id;
}

std::vector<std::string> split_string(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

// Waits on the host until `work` has finished, then rethrows its error. An op on one GPU takes a
// few microseconds: it spins for the first 100 us, then sleeps 20 us at a time (review #20: a
// fixed 50 us sleep dominated small ops). Bounded: the watchdog ends the Work at its deadline.
void wait_on_host(Work& work) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(100);
  while (!work.is_completed()) {
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  work.wait();
}

}  // namespace

// While the op thread calls into NCCL the watchdog must not free the communicators under it: a
// failure found meanwhile is only recorded, and the op thread wakes the watchdog on its way out
// so that it aborts them then.
class NcclBackend::InNccl {
 public:
  InNccl(NcclBackend& b, const OpContext& ctx) : b_(b) {
    std::lock_guard<std::mutex> lock(b_.mutex_);
    if (!b_.failure_.empty()) throw b_.aborted_locked(ctx);
    b_.in_nccl_ = true;
  }
  ~InNccl() {
    {
      std::lock_guard<std::mutex> lock(b_.mutex_);
      b_.in_nccl_ = false;
      if (b_.failure_.empty() || b_.aborted_) return;
    }
    b_.wake_.notify_all();
  }
  InNccl(const InNccl&) = delete;
  InNccl& operator=(const InNccl&) = delete;

 private:
  NcclBackend& b_;
};

NcclBackend::NcclBackend(const BackendContext& ctx)
    : api_(nccl_api()),
      rank_(ctx.rank),
      world_size_(ctx.world_size),
      store_(ctx.store),
      timeout_(ctx.timeout) {
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices == 0) {
    // The runtime's words say why: no device, no driver, or (declared headers) no runtime.
    throw Error(ErrorCode::kUnavailable,
                std::string("nccl: no CUDA device is visible to this process") +
                    (counted != cudaSuccess ? std::string(" (") + cudaGetErrorString(counted) + ")"
                                            : std::string()));
  }
  TUTTI_LOG_DEBUG("nccl: NCCL {} from {}", api_.version, api_.library);
  watchdog_ = std::thread([this, gone = gone_] { watchdog_loop(gone); });
}

NcclBackend::~NcclBackend() {
  // Work still pending is aborted rather than waited for (finalizing a communicator whose op
  // hangs took 10 s each); every pending Work then ends with kAborted.
  abort_if_pending(" was still pending when the group was destroyed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (std::this_thread::get_id() == watchdog_.get_id()) {
    // A completion hook on the watchdog's thread let go of the last reference: the thread cannot
    // join itself; it returns as soon as the hook does, without touching this backend.
    gone_->store(true);
    watchdog_.detach();
  } else if (watchdog_.joinable()) {
    watchdog_.join();
  }
  // Whatever is still listed has finished on the GPU (abort_if_pending failed the rest).
  for (Pending& p : pending_) {
    if (p.work->settle(events_) == cudaSuccess) {
      p.work->finish();
    } else {
      p.work->finish(std::make_exception_ptr(
          Error(ErrorCode::kAborted, p.work->description() + ": the group was destroyed first")));
    }
  }
  pending_.clear();
  // After a failure, what the watchdog has not aborted yet is aborted here; otherwise each
  // communicator is finalized (bounded), then destroyed.
  const bool failed = !failure_.empty();
  for (auto* map : {&collective_, &p2p_}) {
    for (auto& [key, c] : *map) {
      for (size_t i = 0; i < c->comms.size(); ++i) {
        DeviceGuard guard(c->devices[i], std::nothrow);
        if (c->comms[i] == nullptr) continue;
        if (failed) {
          api_.CommAbort(c->comms[i]);
          continue;
        }
        // Finalize waits for the communicator's outstanding work; bounded, then abort.
        ncclResult_t state = api_.CommFinalize(c->comms[i]);
        const auto deadline = Clock::now() + std::chrono::seconds(10);
        while (state == ncclInProgress && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          api_.CommGetAsyncError(c->comms[i], &state);
        }
        if (state == ncclSuccess) {
          api_.CommDestroy(c->comms[i]);
        } else {
          api_.CommAbort(c->comms[i]);
        }
      }
      for (size_t i = 0; i < c->streams.size(); ++i) {
        DeviceGuard guard(c->devices[i], std::nothrow);
        // Stream-ordered: after the stream's last use of it, without waiting on the host.
        if (c->scratch[i] != nullptr) cudaFreeAsync(c->scratch[i], c->streams[i]);
        cudaStreamDestroy(c->streams[i]);
        cudaEventDestroy(c->ready[i]);
      }
    }
  }
}

Error NcclBackend::aborted_locked(const OpContext& ctx) const {
  return Error(ErrorCode::kAborted, ctx.description() + ": the NCCL communicators were stopped (" +
                                        failure_ + "); destroy the group and initialise it again");
}

void NcclBackend::check_nccl(ncclResult_t r, ncclComm_t comm, const OpContext& ctx,
                             const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = api_.GetLastError(comm);
  const std::string msg = ctx.description() + ": " + what + " failed: " + api_.GetErrorString(r) +
                          (last && *last ? std::string(" (") + last + ")" : std::string());
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: throw Error(ErrorCode::kInvalidArgument, msg);
    case ncclRemoteError: throw Error(ErrorCode::kRemoteError, msg);
    case ncclSystemError: throw Error(ErrorCode::kIoError, msg);
    default: throw Error(ErrorCode::kInternal, msg);
  }
}

// Non-blocking communicators may answer ncclInProgress: polls them all until each is done,
// bounded. The first error wins, so that a communicator that failed is not hidden behind one
// that waits for it in vain.
void NcclBackend::wait_enqueued(const std::vector<ncclComm_t>& comms, const OpContext& ctx,
                                const char* what) {
  const auto deadline = ctx.deadline();
  std::vector<bool> done(comms.size(), false);
  size_t left = comms.size();
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_.empty()) throw aborted_locked(ctx);
    }
    for (size_t i = 0; i < comms.size(); ++i) {
      if (done[i]) continue;
      ncclResult_t state = ncclInProgress;
      api_.CommGetAsyncError(comms[i], &state);
      if (state == ncclInProgress) continue;
      check_nccl(state, comms[i], ctx, what);
      done[i] = true;
      --left;
    }
    if (left == 0) return;
    if (Clock::now() > deadline) {
      const std::string why = ctx.description() + " was still being set up after " +
                              std::to_string(ctx.timeout.count()) + " ms";
      fail(why);
      throw Error(ErrorCode::kTimeout, why + " (waiting for the other ranks)");
    }
    // An enqueue takes microseconds, an init up to seconds: spin briefly, then sleep.
    if (polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

void NcclBackend::make_streams(Comms& c) {
  c.streams.assign(c.devices.size(), nullptr);
  c.ready.assign(c.devices.size(), nullptr);
  c.scratch.assign(c.devices.size(), nullptr);
  c.scratch_bytes.assign(c.devices.size(), 0);
  for (size_t i = 0; i < c.devices.size(); ++i) {
    DeviceGuard guard(c.devices[i]);
    cuda_check(cudaStreamCreateWithFlags(&c.streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&c.ready[i], cudaEventDisableTiming), "cudaEventCreate");
  }
}

void NcclBackend::abandon(Comms& c) const {
  for (size_t i = 0; i < c.devices.size(); ++i) {
    DeviceGuard guard(c.devices[i], std::nothrow);
    if (i < c.comms.size() && c.comms[i] != nullptr) api_.CommAbort(c.comms[i]);
    if (i < c.streams.size() && c.streams[i] != nullptr) cudaStreamDestroy(c.streams[i]);
    if (i < c.ready.size() && c.ready[i] != nullptr) cudaEventDestroy(c.ready[i]);
  }
  c.comms.assign(c.devices.size(), nullptr);
  c.streams.assign(c.devices.size(), nullptr);
  c.ready.assign(c.devices.size(), nullptr);
}

void NcclBackend::init_comms(const std::vector<Init>& inits, const OpContext& ctx) {
  // Every id this rank makes is published before it reads any: ranks that each make one id and
  // need another's (the pair communicators of a ring) never wait on each other.
  std::vector<ncclUniqueId> ids(inits.size());
  for (size_t n = 0; n < inits.size(); ++n) {
    if (!inits[n].make_id) continue;
    check_nccl(api_.GetUniqueId(&ids[n]), nullptr, ctx, "ncclGetUniqueId");
    store_->set(inits[n].prefix + "/id", std::string(ids[n].internal, sizeof(ids[n].internal)));
  }
  for (size_t n = 0; n < inits.size(); ++n) {
    if (inits[n].make_id) continue;
    const std::string bytes = store_->get(inits[n].prefix + "/id");
    if (bytes.size() != sizeof(ids[n].internal)) {
      throw Error(ErrorCode::kRemoteError, ctx.description() + ": malformed NCCL unique id");
    }
    std::memcpy(ids[n].internal, bytes.data(), sizeof(ids[n].internal));
  }
  InNccl section(*this, ctx);
  for (const Init& init : inits) {
    const size_t k = init.c->devices.size();
    init.c->comms.assign(k, nullptr);
    init.c->streams.assign(k, nullptr);
    init.c->ready.assign(k, nullptr);
    init.c->scratch.assign(k, nullptr);
    init.c->scratch_bytes.assign(k, 0);
  }
  try {
    std::vector<ncclComm_t> all;
    for (const Init& init : inits) make_streams(*init.c);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking by default: every host-side NCCL call (init, a first op's connection set-up,
    // a group end) then returns at once and is bounded by our deadline and abort. NCCL makes a
    // thread per group end of such a communicator at world size >= 2; TUTTI_NCCL_BLOCKING=1
    // trades the bound for that cost (NCCL has no call to switch a communicator's mode).
    config.blocking = blocking_communicators() ? 1 : 0;
    {
      // One group for all: NCCL requires it when one thread initialises several devices.
      NcclGroup group(api_);
      check_nccl(group.start(), nullptr, ctx, "ncclGroupStart");
      for (size_t n = 0; n < inits.size(); ++n) {
        Comms& c = *inits[n].c;
        for (size_t i = 0; i < c.devices.size(); ++i) {
          DeviceGuard guard(c.devices[i]);
          check_nccl(api_.CommInitRankConfig(&c.comms[i], c.nranks, ids[n],
                                             c.first_rank + static_cast<int>(i), &config),
                     c.comms[i], ctx, "ncclCommInitRankConfig");
          all.push_back(c.comms[i]);
        }
      }
      check_nccl(group.end(), nullptr, ctx, "ncclGroupEnd");
    }
    OpContext init = ctx;
    init.timeout = timeout_;
    wait_enqueued(all, init, "ncclCommInitRankConfig");
  } catch (...) {
    // Nothing of communicators that did not come up may stay: NCCL's init would go on, holding
    // sockets and memory (NCCL's docs abort a communicator whose init timed out). They are not
    // in the maps yet, so the watchdog never sees them.
    for (const Init& init : inits) abandon(*init.c);
    throw;
  }
}

std::vector<NcclBackend::Lane> NcclBackend::lanes_of(Comms& c) {
  std::vector<Lane> lanes;
  for (size_t i = 0; i < c.devices.size(); ++i) lanes.push_back({&c, i});
  return lanes;
}

NcclBackend::Comms& NcclBackend::collective_comms(const std::vector<TensorView>& tensors,
                                                  const OpContext& ctx) {
  const std::string key = device_list_key(tensors);
  last_collective_ = key;
  if (auto it = collective_.find(key); it != collective_.end()) return *it->second;
  auto c = std::make_unique<Comms>();
  for (const auto& t : tensors) c->devices.push_back(t.device().index);
  const int k = static_cast<int>(c->devices.size());
  c->nranks = world_size_ * k;
  c->first_rank = nccl_rank(rank_, k, 0);
  // Every rank makes its collective communicators in the same order: the n-th meets as n.
  c->index = collective_count_++;
  const std::string prefix = "nccl/coll/" + std::to_string(c->index);
  std::string pcis;
  for (int d : c->devices) pcis += (pcis.empty() ? "" : ",") + pci_bus_id(d);
  const std::string host = detail::host_identity();
  store_->set(prefix + "/rank/" + std::to_string(rank_),
              std::to_string(k) + "|" + host + "|" + pcis);
  const auto mine = split_string(pcis, ',');
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const auto fields = split_string(store_->get(prefix + "/rank/" + std::to_string(r)), '|');
    if (fields.size() != 3 || std::atoi(fields[0].c_str()) != k) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx.description() + ": rank " + std::to_string(r) + " drives " +
                      (fields.empty() ? "?" : fields[0]) + " GPU(s) in this op, this rank " +
                      std::to_string(k) + ": every process must drive the same number");
    }
    if (fields[1] != host) continue;
    for (const auto& theirs : split_string(fields[2], ',')) {
      if (std::find(mine.begin(), mine.end(), theirs) != mine.end()) {
        throw Error(ErrorCode::kInvalidUsage, ctx.description() + ": ranks " + std::to_string(r) +
                                                  " and " + std::to_string(rank_) +
                                                  " both use GPU " + theirs +
                                                  ": NCCL needs each GPU in one rank only");
      }
    }
  }
  init_comms({{c.get(), prefix, rank_ == 0}}, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  return *collective_.emplace(key, std::move(c)).first->second;
}

// Grows the scratch buffer in stream order on the communicator's stream: the old one is freed
// once the ops queued there are done with it, and nothing waits on the host (a
// cudaStreamSynchronize and a cudaFree, which may synchronise the whole device, could wait
// without bound before the op even had a deadline).
void* NcclBackend::scratch(Comms& c, size_t i, size_t bytes) {
  if (c.scratch_bytes[i] < bytes) {
    DeviceGuard guard(c.devices[i]);
    if (c.scratch[i] != nullptr) {
      cuda_check(cudaFreeAsync(c.scratch[i], c.streams[i]), "cudaFreeAsync");
    }
    c.scratch[i] = nullptr;
    c.scratch_bytes[i] = 0;
    cuda_check(cudaMallocAsync(&c.scratch[i], bytes, c.streams[i]),
               "cudaMallocAsync of " + std::to_string(bytes) + " bytes");
    c.scratch_bytes[i] = bytes;
  }
  return c.scratch[i];
}

Backend::WorkPtr NcclBackend::launch(const std::vector<Lane>& lanes, const OpOptions& opts,
                                     const OpContext& ctx, const Issue& issue) {
  auto work = std::make_shared<NcclWork>(ctx);
  // Null: the legacy default stream of each lane's device (review #24: see OpOptions).
  const auto caller = static_cast<cudaStream_t>(opts.stream);
  bool watchdog_idle = false;
  {
    InNccl section(*this, ctx);
    if (opts.stream != nullptr) {
      for (const Lane& l : lanes) {
        if (l.device() != lanes[0].device()) {
          throw Error(ErrorCode::kInvalidArgument,
                      ctx.description() +
                          ": an explicit stream belongs to one device; this op "
                          "runs on several, each after its default stream");
        }
      }
    }
    // Ordered after the caller's work.
    for (const Lane& l : lanes) {
      DeviceGuard guard(l.device());
      cuda_check(cudaEventRecord(l.c->ready[l.i], caller), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(l.stream(), l.c->ready[l.i], 0), "cudaStreamWaitEvent");
    }
    issue(Phase::kBefore);  // copies that must precede the op
    ncclResult_t enqueued = ncclInProgress;
    {
      // Always a group, also for one call: the calls of one op (sends and receives to several
      // peers, several devices) must reach NCCL together.
      NcclGroup group(api_);
      check_nccl(group.start(), nullptr, ctx, "ncclGroupStart");
      issue(Phase::kNccl);
      enqueued = group.end();
      check_nccl(enqueued, nullptr, ctx, "ncclGroupEnd");
    }
    // ncclSuccess from a non-blocking communicator's group end: every call is enqueued (only
    // ncclInProgress asks for polling).
    if (enqueued == ncclInProgress) {
      std::vector<ncclComm_t> comms;
      for (const Lane& l : lanes) {
        if (std::find(comms.begin(), comms.end(), l.comm()) == comms.end()) {
          comms.push_back(l.comm());
        }
      }
      wait_enqueued(comms, ctx, "enqueue");
    }
    issue(Phase::kAfter);  // copies that follow the op
    // The caller's stream waits for the op, unless the host waits for it here (blocking: once
    // this returns, what the caller queues next comes after the op anyway; 0.3-0.9 us of an
    // 8-byte op on an H200); the watchdog watches it against the timeout.
    for (const Lane& l : lanes) {
      DeviceGuard guard(l.device());
      cudaEvent_t done = events_.take(l.device());
      work->add_event(l.device(), done);  // the Work holds it from here, also if a call throws
      cuda_check(cudaEventRecord(done, l.stream()), "cudaEventRecord");
      if (!opts.blocking) cuda_check(cudaStreamWaitEvent(caller, done, 0), "cudaStreamWaitEvent");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    // A failure that came meanwhile has ended every listed Work: this one would be forgotten.
    if (!failure_.empty()) throw aborted_locked(ctx);
    watchdog_idle = napping_;
    napping_ = false;
    listed_ = true;
    pending_.push_back({work, ctx.deadline(), ctx.timeout});
  }
  // The watchdog is woken only out of its idle sleep: while ops come it looks every 2 ms
  // anyway. Waking it for every op cost 1.5-2 us of an 8-byte op on an H200 (the futex wake,
  // and its event queries and lock beside the op thread's calls).
  if (watchdog_idle) {
    // Once per idle spell: NcclFault.ARunOfOpsWakesTheWatchdogOnce counts these lines.
    TUTTI_LOG_DEBUG("nccl: op #{} wakes the watchdog from its idle sleep", ctx.seq);
    wake_.notify_all();
  }
  if (!opts.blocking) return work;
  // Blocking: out of NCCL (so that the watchdog keeps checking its asynchronous errors
  // meanwhile), never past the deadline (the watchdog ends the Work at it).
  try {
    wait_on_host(*work);
  } catch (...) {
    // Failed (a timeout, an abort): the op may still run on the GPU until the watchdog has
    // stopped the communicators. The caller's stream waits for the op's streams, as after a
    // non-blocking op, so that what the caller queues next (a free, a reuse of the buffers)
    // never meets it. The group holds its op lock until this returns: the lanes are alive.
    for (const Lane& l : lanes) {
      DeviceGuard guard(l.device(), std::nothrow);
      if (cudaEventRecord(l.c->ready[l.i], l.stream()) == cudaSuccess) {
        cudaStreamWaitEvent(caller, l.c->ready[l.i], 0);
      }
    }
    throw;
  }
  // Done: off the watchdog's list now rather than at its next look (every blocking op would
  // otherwise stay listed for up to 2 ms: ~800 of them at 2.4 us each, queried and erased under
  // the lock each pass).
  work->settle_finished(events_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = pending_.end(); it != pending_.begin();) {
      --it;
      if (it->work == work) {
        pending_.erase(it);
        break;
      }
    }
  }
  return nullptr;
}

void NcclBackend::synchronize(Device device) {
  // Waits for the device's legacy default stream, which every op without an explicit stream
  // made wait for it, and for the group's own streams on the device, which cover ops given an
  // explicit (non-blocking) stream; never past the group's timeout.
  DeviceGuard guard(device.index);
  std::vector<cudaStream_t> streams = {cudaStream_t{}};
  for (auto* map : {&collective_, &p2p_}) {
    for (auto& [key, c] : *map) {
      for (size_t i = 0; i < c->streams.size(); ++i) {
        if (c->devices[i] == device.index) streams.push_back(c->streams[i]);
      }
    }
  }
  struct Marks {
    std::vector<cudaEvent_t> e;
    ~Marks() {
      for (cudaEvent_t x : e) cudaEventDestroy(x);
    }
  } marks;
  for (cudaStream_t stream : streams) {
    cudaEvent_t mark;
    cuda_check(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming), "cudaEventCreate");
    marks.e.push_back(mark);
    cuda_check(cudaEventRecord(mark, stream), "cudaEventRecord");
  }
  const auto deadline = deadline_after(timeout_);
  for (cudaEvent_t mark : marks.e) {
    while (true) {
      const cudaError_t e = cudaEventQuery(mark);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) cuda_check(e, "cudaEventQuery");
      if (Clock::now() > deadline) {
        throw Error(ErrorCode::kTimeout, "nccl: synchronize(" + device.str() +
                                             ") timed out after " +
                                             std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

void NcclBackend::abort(const std::string& reason) {
  fail(reason);
}

// What NCCL offers for subgroups, ncclCommSplit, is collective over every rank of the parent
// communicator: ranks outside the subgroup must call it too, with NCCL_SPLIT_NOCOLOR. But
// CollectiveGroup::split calls Backend::split on the subgroup's members only (the others get
// null before the backend is asked), and the parent's communicators are made lazily, one per
// device list, so there may be several or none to split. So split() keeps Backend's default: the
// subgroup's backend comes from the factory and makes its communicators on first use, through
// the subgroup's own store, as any group does (one NCCL bootstrap per device list).

void NcclBackend::abort_if_pending(const std::string& why) {
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    for (const Pending& p : pending_) {
      if (p.work->query() == cudaErrorNotReady) {
        pending = p.work->description();
        break;
      }
    }
  }
  if (!pending.empty()) fail(pending + why);
}

void NcclBackend::fail(const std::string& why, const NcclWork* culprit, ErrorCode code) {
  // Each Work's end is decided under the lock, before the watchdog can abort the communicators
  // (an aborted op's events fire as if it had finished), and carried out without it: a
  // completion hook may let go of this backend.
  std::vector<std::pair<std::shared_ptr<NcclWork>, std::exception_ptr>> ends;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = why;
    for (Pending& p : pending_) {
      const cudaError_t state = p.work->settle(events_);
      std::exception_ptr error;
      if (p.work.get() == culprit) {
        error = std::make_exception_ptr(Error(code, why + "; the NCCL communicators were stopped"));
      } else if (state != cudaSuccess) {
        error = std::make_exception_ptr(Error(
            ErrorCode::kAborted, p.work->description() + ": the NCCL communicators were stopped (" +
                                     why + "); destroy the group and initialise it again"));
      }
      ends.emplace_back(std::move(p.work), std::move(error));
    }
    pending_.clear();
  }
  TUTTI_LOG_ERROR("nccl: stopping the communicators (revoke or abort): {}", why);
  wake_.notify_all();  // the watchdog aborts the communicators
  for (auto& [work, error] : ends) work->finish(error);
}

std::vector<ncclComm_t> NcclBackend::take_comms_locked() {
  aborted_ = true;
  std::vector<ncclComm_t> taken;
  for (auto* map : {&collective_, &p2p_}) {
    for (auto& [key, c] : *map) {
      for (ncclComm_t& comm : c->comms) {
        if (comm != nullptr) taken.push_back(comm);
        // Revoked ones stay, for a shrink; the destructor aborts them.
        if (api_.CommRevoke == nullptr) comm = nullptr;
      }
    }
  }
  return taken;
}

void NcclBackend::stop_comms(const std::vector<ncclComm_t>& comms) {
  std::vector<ncclComm_t> aborted;
  for (ncclComm_t comm : comms) {
    const ncclResult_t r =
        api_.CommRevoke != nullptr ? api_.CommRevoke(comm, NCCL_REVOKE_DEFAULT) : ncclInternalError;
    if (r == ncclSuccess || r == ncclInProgress) continue;
    if (api_.CommRevoke != nullptr) {
      TUTTI_LOG_WARN("nccl: ncclCommRevoke failed ({}); aborting the communicator instead",
                     api_.GetErrorString(r));
    }
    api_.CommAbort(comm);
    aborted.push_back(comm);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto* map : {&collective_, &p2p_}) {
    for (auto& [key, c] : *map) {
      for (ncclComm_t& comm : c->comms) {
        if (std::find(aborted.begin(), aborted.end(), comm) != aborted.end()) comm = nullptr;
      }
    }
  }
  stopped_ = true;
  wake_.notify_all();
}

void NcclBackend::watchdog_loop(std::shared_ptr<std::atomic<bool>> gone) {
  std::unique_lock<std::mutex> lock(mutex_);
  int quiet_looks = kQuietLooks;
  while (!stop_) {
    if (!failure_.empty()) {
      // Aborts once the op thread is out of NCCL, and without holding the lock: NCCL's abort
      // may wait for a stuck stream (NVIDIA/nccl#829), and every tutti call needs the lock.
      if (!aborted_ && !in_nccl_) {
        const std::vector<ncclComm_t> comms = take_comms_locked();
        lock.unlock();
        stop_comms(comms);
        lock.lock();
      } else {
        wake_.wait_for(lock, std::chrono::milliseconds(200));
      }
      continue;
    }
    // Every 2 ms while ops come; the long sleep once none was listed for kQuietLooks looks.
    if (listed_ || !pending_.empty()) quiet_looks = 0;
    listed_ = false;
    napping_ = pending_.empty() && quiet_looks >= kQuietLooks;
    wake_.wait_for(lock, napping_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(2));
    napping_ = false;
    quiet_looks = std::min(quiet_looks + 1, kQuietLooks);
    if (stop_ || !failure_.empty()) continue;
    // The events are queried without the lock (review #22): a query may wait behind a driver
    // lock that a synchronising call on another thread holds, and every tutti call needs ours.
    const std::vector<Pending> watched(pending_.begin(), pending_.end());
    lock.unlock();
    std::vector<std::shared_ptr<NcclWork>> done;
    std::string why;
    std::shared_ptr<NcclWork> culprit;
    ErrorCode code = ErrorCode::kAborted;
    const auto now = Clock::now();
    for (const Pending& p : watched) {
      const cudaError_t e = p.work->query();
      if (e == cudaSuccess) {
        done.push_back(p.work);
        continue;
      }
      if (e != cudaErrorNotReady) {
        why = p.work->description() + " failed on the GPU: " + cudaGetErrorString(e);
      } else if (now > p.deadline) {
        why = p.work->description() + " did not complete within its timeout of " +
              std::to_string(p.timeout.count()) + " ms";
        code = ErrorCode::kTimeout;
      } else {
        continue;  // still running, in time
      }
      culprit = p.work;
      break;
    }
    for (const auto& w : done) w->settle(events_);
    lock.lock();
    // (Looked up in a sorted copy: a binary search each, not a scan; `done` keeps issue order,
    // in which the Works finish below.)
    std::vector<const NcclWork*> finished;
    finished.reserve(done.size());
    for (const auto& w : done) finished.push_back(w.get());
    std::sort(finished.begin(), finished.end(), std::less<const NcclWork*>());
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const Pending& p) {
                                    return std::binary_search(finished.begin(), finished.end(),
                                                              p.work.get(),
                                                              std::less<const NcclWork*>());
                                  }),
                   pending_.end());
    // NCCL's asynchronous errors, never while the op thread is inside NCCL: a communicator is
    // not thread-safe, ncclCommGetAsyncError included (NCCL 2.28 frees its group job unlocked).
    // Under the lock on purpose: `in_nccl_` must stay false while the query runs. Should it
    // ever stall (a driver lock held by a syncing call elsewhere), the op thread waits with it:
    // the price of never racing NCCL on a communicator. The event queries above, the calls
    // c10d's heartbeat guards against, run without the lock.
    if (why.empty() && !in_nccl_ && failure_.empty()) {
      for (auto* map : {&collective_, &p2p_}) {
        for (auto& [key, c] : *map) {
          for (ncclComm_t comm : c->comms) {
            ncclResult_t state = ncclSuccess;
            if (comm != nullptr && api_.CommGetAsyncError(comm, &state) == ncclSuccess &&
                state != ncclSuccess && state != ncclInProgress && why.empty()) {
              // Named after the oldest op still pending: the one that hangs on the error.
              const char* last = api_.GetLastError(comm);
              if (!pending_.empty()) culprit = pending_.front().work;
              why = (culprit ? culprit->description() + " failed"
                             : std::string("with no op pending")) +
                    ": NCCL reported an asynchronous error: " + api_.GetErrorString(state) +
                    (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : "");
            }
          }
        }
      }
    }
    lock.unlock();
    // Completion hooks run here, on this thread, without the lock; one may let go of the last
    // reference to this backend (then `gone`): nothing of it is touched after that.
    for (const auto& w : done) w->finish();
    done.clear();
    if (gone->load()) return;
    if (!why.empty()) {
      fail(why, culprit.get(), code);
      culprit.reset();
      if (gone->load()) return;
    }
    lock.lock();
  }
}

}  // namespace tutti::nccl_backend
