#include "nccl_backend.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "host_identity.h"
#include "logging.h"
#include "nccl_api.h"
#include "nccl_types.h"
#include "tensor_list.h"
#include "tutti/error.h"

namespace tutti::nccl_backend {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw Error(ErrorCode::kInternal, "nccl: " + what + ": " + cudaGetErrorString(e));
  }
}

// Makes a device current for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (device != previous_) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  // For destructors, which must not throw: a failed switch shows in the calls that follow.
  DeviceGuard(int device, std::nothrow_t) {
    cudaGetDevice(&previous_);
    if (device != previous_) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// An NCCL group that always ends: a throw between ncclGroupStart and ncclGroupEnd would leave
// this thread's later NCCL calls, an abort included, queued in a group that never ends.
class NcclGroup {
 public:
  explicit NcclGroup(const NcclApi& api) : api_(api) {}
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) api_.GroupEnd();
  }
  ncclResult_t start() {
    const ncclResult_t r = api_.GroupStart();
    open_ = r == ncclSuccess;
    return r;
  }
  ncclResult_t end() {
    open_ = false;
    return api_.GroupEnd();
  }

 private:
  const NcclApi& api_;
  bool open_ = false;
};

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

}  // namespace

// While the op thread calls into NCCL the watchdog must not free the communicators under it: a
// failure found meanwhile is only recorded, and the op thread wakes the watchdog on its way out
// so that it aborts them then.
class NcclBackend::InNccl {
 public:
  InNccl(NcclBackend& b, const OpContext& ctx) : b_(b) {
    std::lock_guard<std::mutex> lock(b_.mutex_);
    if (!b_.failure_.empty()) {
      throw Error(ErrorCode::kAborted, ctx.description() +
                                           ": the NCCL communicators were aborted: " +
                                           b_.failure_ + "; destroy the group and initialise it "
                                                         "again");
    }
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
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw Error(ErrorCode::kUnavailable, "nccl: no CUDA device is visible to this process");
  }
  TUTTI_LOG_DEBUG("nccl: NCCL {} from {}", api_.version, api_.library);
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclBackend::~NcclBackend() {
  abort_if_pending();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
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
      }
    }
  }
}

NcclBackend::Events::~Events() {
  for (cudaEvent_t x : e) cudaEventDestroy(x);
}

void NcclBackend::check_failed(const OpContext& ctx) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) {
    throw Error(ErrorCode::kAborted, ctx.description() +
                                         ": the NCCL communicators were aborted: " + failure_ +
                                         "; destroy the group and initialise it again");
  }
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
  const auto deadline = Clock::now() + ctx.timeout;
  std::vector<bool> done(comms.size(), false);
  size_t left = comms.size();
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_.empty()) {
        throw Error(ErrorCode::kAborted, ctx.description() +
                                             ": the NCCL communicators were aborted: " + failure_);
      }
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
      fail_all(why);
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

void NcclBackend::init_comms(Comms& c, const std::string& prefix, bool make_id,
                             const OpContext& ctx) {
  ncclUniqueId id;
  if (make_id) {
    check_nccl(api_.GetUniqueId(&id), nullptr, ctx, "ncclGetUniqueId");
    store_->set(prefix + "/id", std::string(id.internal, sizeof(id.internal)));
  } else {
    const std::string bytes = store_->get(prefix + "/id");
    if (bytes.size() != sizeof(id.internal)) {
      throw Error(ErrorCode::kRemoteError, ctx.description() + ": malformed NCCL unique id");
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  InNccl section(*this, ctx);
  const size_t k = c.devices.size();
  c.comms.assign(k, nullptr);
  c.streams.assign(k, nullptr);
  c.scratch.assign(k, nullptr);
  c.scratch_bytes.assign(k, 0);
  try {
    for (size_t i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      cuda_check(cudaStreamCreateWithFlags(&c.streams[i], cudaStreamNonBlocking),
                 "cudaStreamCreate");
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // bounded by our own deadline below
    {
      NcclGroup group(api_);
      if (k > 1) check_nccl(group.start(), nullptr, ctx, "ncclGroupStart");
      for (size_t i = 0; i < k; ++i) {
        DeviceGuard guard(c.devices[i]);
        check_nccl(api_.CommInitRankConfig(&c.comms[i], c.nranks, id,
                                           c.first_rank + static_cast<int>(i), &config),
                   c.comms[i], ctx, "ncclCommInitRankConfig");
      }
      if (k > 1) check_nccl(group.end(), nullptr, ctx, "ncclGroupEnd");
    }
    OpContext init = ctx;
    init.timeout = timeout_;
    wait_enqueued(c.comms, init, "ncclCommInitRankConfig");
  } catch (...) {
    // Nothing of communicators that did not come up may stay: NCCL's init would go on, holding
    // sockets and memory (NCCL's docs abort a communicator whose init timed out). They are not
    // in the maps yet, so the watchdog never sees them.
    for (ncclComm_t& comm : c.comms) {
      if (comm != nullptr) api_.CommAbort(comm);
      comm = nullptr;
    }
    for (cudaStream_t& s : c.streams) {
      if (s != nullptr) cudaStreamDestroy(s);
      s = nullptr;
    }
    throw;
  }
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
  const std::string prefix = "nccl/coll/" + std::to_string(collective_count_++);
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
        throw Error(ErrorCode::kInvalidUsage,
                    ctx.description() + ": ranks " + std::to_string(r) + " and " +
                        std::to_string(rank_) + " both use GPU " + theirs +
                        ": NCCL needs each GPU in one rank only");
      }
    }
  }
  init_comms(*c, prefix, rank_ == 0, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  return *collective_.emplace(key, std::move(c)).first->second;
}

NcclBackend::Comms& NcclBackend::p2p_comms(int device, int peer_rank, int peer_device,
                                           const OpContext& ctx) {
  // One two-rank communicator per pair of (rank, GPU), named the same from both ends.
  const bool low = rank_ < peer_rank;
  const std::string me = std::to_string(rank_) + ":" + std::to_string(device);
  const std::string peer = std::to_string(peer_rank) + ":" + std::to_string(peer_device);
  const std::string key = low ? me + "-" + peer : peer + "-" + me;
  if (auto it = p2p_.find(key); it != p2p_.end()) return *it->second;
  auto c = std::make_unique<Comms>();
  c->devices = {device};
  c->nranks = 2;
  c->first_rank = low ? 0 : 1;
  init_comms(*c, "nccl/p2p/" + key, low, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  return *p2p_.emplace(key, std::move(c)).first->second;
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

template <typename Issue>
void NcclBackend::launch(Comms& c, const OpOptions& opts, const OpContext& ctx, Issue&& issue) {
  const size_t k = c.devices.size();
  auto caller = [&](size_t) {
    return opts.stream != nullptr ? static_cast<cudaStream_t>(opts.stream) : cudaStream_t{};
  };
  std::shared_ptr<Events> done;
  {
    InNccl section(*this, ctx);
    if (opts.stream != nullptr && k > 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx.description() + ": an explicit stream belongs to one device; a list of " +
                      std::to_string(k) + " uses each device's default stream");
    }
    // Ordered after the caller's work.
    for (size_t i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      cudaEvent_t ready;
      cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
      cuda_check(cudaEventRecord(ready, caller(i)), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(c.streams[i], ready, 0), "cudaStreamWaitEvent");
      cudaEventDestroy(ready);  // released once the wait is done
    }
    issue(/*phase=*/0);  // copies that must precede the op
    NcclGroup group(api_);
    if (k > 1) check_nccl(group.start(), nullptr, ctx, "ncclGroupStart");
    issue(/*phase=*/1);  // the NCCL calls
    if (k > 1) check_nccl(group.end(), nullptr, ctx, "ncclGroupEnd");
    wait_enqueued(c.comms, ctx, "enqueue");
    issue(/*phase=*/2);  // copies that follow the op
    // The caller's stream waits for the op; the watchdog watches it against the timeout.
    Pending p;
    p.devices = c.devices;
    p.deadline = Clock::now() + ctx.timeout;
    p.description = ctx.description();
    for (size_t i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      cudaEvent_t event;
      cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
      p.done->e.push_back(event);  // destroyed with p.done, also when a call below throws
      cuda_check(cudaEventRecord(event, c.streams[i]), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(caller(i), event, 0), "cudaStreamWaitEvent");
    }
    done = p.done;
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(std::move(p));
  }
  wake_.notify_all();
  if (!opts.blocking) return;
  // Blocking: wait on the host, out of NCCL (so that the watchdog keeps checking its
  // asynchronous errors meanwhile), never past the deadline (the watchdog aborts at it).
  for (size_t i = 0; i < k; ++i) {
    while (true) {
      check_failed(ctx);
      const cudaError_t e = cudaEventQuery(done->e[i]);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) cuda_check(e, "cudaEventQuery");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

Backend::WorkPtr NcclBackend::allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                            const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, tensors[0].dtype());
  const size_t n = static_cast<size_t>(tensors[0].numel());
  launch(c, opts, ctx, [&](int phase) {
    if (phase != 1) return;
    for (size_t i = 0; i < tensors.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.AllReduce(tensors[i].data(), tensors[i].data(), n, dt, op, c.comms[i],
                                c.streams[i]),
                 c.comms[i], ctx, "ncclAllReduce");
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                            const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const int k = static_cast<int>(tensors.size());
  const int root = nccl_rank(opts.root_rank, k, opts.root_tensor);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  const size_t n = static_cast<size_t>(tensors[0].numel());
  launch(c, opts, ctx, [&](int phase) {
    if (phase != 1) return;
    for (int i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.Broadcast(tensors[i].data(), tensors[i].data(), n, dt, root, c.comms[i],
                                c.streams[i]),
                 c.comms[i], ctx, "ncclBroadcast");
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                         const OpContext& ctx) {
  Comms& c = collective_comms(tensors, ctx);
  const int k = static_cast<int>(tensors.size());
  const int root = nccl_rank(opts.root_rank, k, opts.root_tensor);
  const ncclDataType_t dt = to_nccl(tensors[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, tensors[0].dtype());
  const size_t n = static_cast<size_t>(tensors[0].numel());
  launch(c, opts, ctx, [&](int phase) {
    if (phase != 1) return;
    for (int i = 0; i < k; ++i) {
      DeviceGuard guard(c.devices[i]);
      // In place: only the root's buffer receives (NCCL reads the others' as input only).
      check_nccl(api_.Reduce(tensors[i].data(), tensors[i].data(), n, dt, op, root, c.comms[i],
                             c.streams[i]),
                 c.comms[i], ctx, "ncclReduce");
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                            const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                            const OpContext& ctx) {
  Comms& c = collective_comms(inputs, ctx);
  const ncclDataType_t dt = to_nccl(inputs[0].dtype());
  const size_t n = static_cast<size_t>(inputs[0].numel());
  const size_t bytes = inputs[0].nbytes();
  std::vector<void*> recv(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    recv[i] = detail::back_to_back(outputs[i]) ? outputs[i][0].data()
                                       : scratch(c, i, bytes * outputs[i].size());
  }
  launch(c, opts, ctx, [&](int phase) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      if (phase == 1) {
        check_nccl(api_.AllGather(inputs[i].data(), recv[i], n, dt, c.comms[i], c.streams[i]),
                   c.comms[i], ctx, "ncclAllGather");
      } else if (phase == 2 && recv[i] != outputs[i][0].data()) {
        for (size_t j = 0; j < outputs[i].size(); ++j) {
          cuda_check(cudaMemcpyAsync(outputs[i][j].data(), static_cast<char*>(recv[i]) + j * bytes,
                                     bytes, cudaMemcpyDeviceToDevice, c.streams[i]),
                     "cudaMemcpyAsync");
        }
      }
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                 const std::vector<std::vector<TensorView>>& inputs,
                                 const ReduceScatterOptions& opts, const OpContext& ctx) {
  Comms& c = collective_comms(outputs, ctx);
  const ncclDataType_t dt = to_nccl(outputs[0].dtype());
  const ncclRedOp_t op = to_nccl(opts.reduce_op, outputs[0].dtype());
  const size_t n = static_cast<size_t>(outputs[0].numel());
  const size_t bytes = outputs[0].nbytes();
  std::vector<void*> send(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    send[i] = detail::back_to_back(inputs[i]) ? inputs[i][0].data()
                                      : scratch(c, i, bytes * inputs[i].size());
  }
  launch(c, opts, ctx, [&](int phase) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      if (phase == 0 && send[i] != inputs[i][0].data()) {
        for (size_t j = 0; j < inputs[i].size(); ++j) {
          cuda_check(cudaMemcpyAsync(static_cast<char*>(send[i]) + j * bytes, inputs[i][j].data(),
                                     bytes, cudaMemcpyDeviceToDevice, c.streams[i]),
                     "cudaMemcpyAsync");
        }
      } else if (phase == 1) {
        check_nccl(api_.ReduceScatter(send[i], outputs[i].data(), n, dt, op, c.comms[i],
                                      c.streams[i]),
                   c.comms[i], ctx, "ncclReduceScatter");
      }
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::barrier(const BarrierOptions& opts, const OpContext& ctx) {
  // NCCL has no barrier: a one-element allreduce, waited for, over the devices of the last
  // collective (the same communicator on every rank, which all ran the same collectives), or
  // over this process's current GPU before any. Not simply the current GPU: a rank whose
  // current GPU changed would make a communicator that its peers never make.
  std::vector<TensorView> probes;
  if (auto it = collective_.find(last_collective_); it != collective_.end()) {
    for (int d : it->second->devices) {
      probes.emplace_back(reinterpret_cast<void*>(16), DType::kUInt8, std::vector<int64_t>{1},
                          Device::cuda(d));
    }
  } else {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    probes.emplace_back(reinterpret_cast<void*>(16), DType::kUInt8, std::vector<int64_t>{1},
                        Device::cuda(device));
  }
  Comms& c = collective_comms(probes, ctx);
  std::vector<void*> one(c.devices.size());
  for (size_t i = 0; i < one.size(); ++i) one[i] = scratch(c, i, 16);
  BarrierOptions blocking = opts;
  blocking.blocking = true;
  launch(c, blocking, ctx, [&](int phase) {
    if (phase != 1) return;
    for (size_t i = 0; i < one.size(); ++i) {
      DeviceGuard guard(c.devices[i]);
      check_nccl(api_.AllReduce(one[i], one[i], 1, ncclUint8, ncclMax, c.comms[i], c.streams[i]),
                 c.comms[i], ctx, "ncclAllReduce (barrier)");
    }
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::send(const std::vector<TensorView>& tensors, int dst_rank,
                       const SendOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Comms& c = p2p_comms(t.device().index, dst_rank, opts.dst_device_index, ctx);
  const int peer = 1 - c.first_rank;
  launch(c, opts, ctx, [&](int phase) {
    if (phase != 1) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(api_.Send(t.data(), static_cast<size_t>(t.numel()), to_nccl(t.dtype()), peer,
                         c.comms[0], c.streams[0]),
               c.comms[0], ctx, "ncclSend");
  });
  return nullptr;
}

Backend::WorkPtr NcclBackend::recv(const std::vector<TensorView>& tensors, int src_rank,
                       const RecvOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Comms& c = p2p_comms(t.device().index, src_rank, opts.src_device_index, ctx);
  const int peer = 1 - c.first_rank;
  launch(c, opts, ctx, [&](int phase) {
    if (phase != 1) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(api_.Recv(t.data(), static_cast<size_t>(t.numel()), to_nccl(t.dtype()), peer,
                         c.comms[0], c.streams[0]),
               c.comms[0], ctx, "ncclRecv");
  });
  return nullptr;
}

void NcclBackend::abort(const std::string& reason) { fail_all("aborted: " + reason); }

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
  Events marks;
  for (cudaStream_t stream : streams) {
    cudaEvent_t mark;
    cuda_check(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming), "cudaEventCreate");
    marks.e.push_back(mark);
    cuda_check(cudaEventRecord(mark, stream), "cudaEventRecord");
  }
  const auto deadline = Clock::now() + timeout_;
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
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// The destructor calls this first: work still pending is aborted rather than waited for
// (finalizing a communicator whose op hangs took 10 s each); with nothing pending, the
// communicators are finalized as usual.
void NcclBackend::abort_if_pending() {
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    if (in_nccl_) pending = "an op";
    for (const Pending& p : pending_) {
      for (cudaEvent_t e : p.done->e) {
        if (pending.empty() && cudaEventQuery(e) == cudaErrorNotReady) pending = p.description;
      }
    }
  }
  if (!pending.empty()) fail_all(pending + " was still pending when the group was aborted or destroyed");
}

// Records the first failure; the watchdog aborts the communicators.
void NcclBackend::fail_all(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = why;
  }
  TUTTI_LOG_ERROR("nccl: aborting communicators: {}", why);
  wake_.notify_all();
}

std::vector<ncclComm_t> NcclBackend::take_comms_locked() {
  aborted_ = true;
  std::vector<ncclComm_t> taken;
  for (auto* map : {&collective_, &p2p_}) {
    for (auto& [key, c] : *map) {
      for (ncclComm_t& comm : c->comms) {
        if (comm != nullptr) taken.push_back(comm);
        comm = nullptr;
      }
    }
  }
  return taken;
}

void NcclBackend::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    // Aborts once the op thread is out of NCCL, and without holding the lock: NCCL's abort may
    // wait for a stuck stream (NVIDIA/nccl#829), and every tutti call needs the lock.
    if (!failure_.empty() && !aborted_ && !in_nccl_) {
      const std::vector<ncclComm_t> comms = take_comms_locked();
      lock.unlock();
      for (ncclComm_t comm : comms) api_.CommAbort(comm);
      lock.lock();
      continue;
    }
    wake_.wait_for(lock, !failure_.empty() || pending_.empty() ? std::chrono::milliseconds(200)
                                                               : std::chrono::milliseconds(2));
    if (!failure_.empty()) continue;
    std::string why;
    while (!pending_.empty() && why.empty()) {
      Pending& p = pending_.front();
      bool all_done = true;
      for (size_t i = 0; i < p.done->e.size(); ++i) {
        cudaSetDevice(p.devices[i]);
        const cudaError_t e = cudaEventQuery(p.done->e[i]);
        if (e == cudaErrorNotReady) {
          all_done = false;
        } else if (e != cudaSuccess) {
          why = p.description + " failed on the GPU: " + cudaGetErrorString(e);
        }
      }
      if (!why.empty()) break;
      if (!all_done) {
        if (Clock::now() > p.deadline) {
          why = p.description + " did not complete within its timeout";
        }
        break;  // ops complete in order: later ones are not done either
      }
      pending_.pop_front();
    }
    // NCCL's asynchronous errors, never while the op thread is inside NCCL: a communicator is
    // not thread-safe, ncclCommGetAsyncError included (NCCL 2.28 frees its group job unlocked).
    if (why.empty() && !in_nccl_) {
      for (auto* map : {&collective_, &p2p_}) {
        for (auto& [key, c] : *map) {
          for (ncclComm_t comm : c->comms) {
            ncclResult_t state = ncclSuccess;
            if (comm != nullptr && api_.CommGetAsyncError(comm, &state) == ncclSuccess &&
                state != ncclSuccess && state != ncclInProgress) {
              // Named after the oldest op still pending: the one that hangs on the error.
              const char* last = api_.GetLastError(comm);
              why = (pending_.empty() ? std::string("with no op pending")
                                      : pending_.front().description + " failed") +
                    ": NCCL reported an asynchronous error: " + api_.GetErrorString(state) +
                    (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : "");
            }
          }
        }
      }
    }
    if (!why.empty()) {
      failure_ = why;
      TUTTI_LOG_ERROR("nccl: aborting communicators: {}", why);
    }
  }
}

}  // namespace tutti::nccl_backend
