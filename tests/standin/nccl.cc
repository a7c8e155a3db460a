// A stand-in for NCCL (libnccl.so.2), for tests only: never installed. tutti's NCCL backend
// loads it, unchanged, through TUTTI_NCCL_LIBRARY.
//
// It runs on the stand-in CUDA runtime (device memory is host memory, a stream is a worker
// thread) and performs real collectives and point-to-point transfers: each op becomes a host
// function on the caller's stream, which exchanges the rank's data with its peers through the
// communicator's clique (nccl_clique.h), then reduces in rank order. Ranks may be threads of one
// process, several devices of one process, or separate processes.
//
// NCCL's rules are kept where tutti relies on them: calls between ncclGroupStart and
// ncclGroupEnd are issued together at the group's end (per thread); a non-blocking communicator
// (config.blocking = 0) answers ncclInProgress to its init and to each group end for a while,
// and its ops reach the stream only after that; buffers must be device memory of the
// communicator's device, and its stream must belong to that device; a communicator is not
// thread-safe (a second thread calling into one while another is inside is reported on stderr
// and counted); ncclCommAbort may come from any thread and wakes whatever waits (but, like
// NCCL's, waits for work of a multi-rank communicator that is queued behind a stalled stream).
// ncclCommRevoke stops what runs and keeps the communicator, in progress until quiescent, for
// ncclCommShrink, which the remaining ranks call (NCCL_SHRINK_DEFAULT refuses work in flight).
//
// Environment:
//   TUTTI_STANDIN_NCCL_DELAY_MS    how long non-blocking init and group ends answer
//                                  ncclInProgress (default 2)
//   TUTTI_STANDIN_NCCL_ASYNC_ERROR "N" or "N:R": the N-th op (from 0) run on a communicator of
//                                  NCCL rank R (any rank if omitted) sets the asynchronous error
//                                  ncclRemoteError (the delay above after its enqueue completed)
//                                  and hangs until the communicator is aborted, as a lost peer
//                                  does; once per process
//   TUTTI_STANDIN_NCCL_STALL       "N:MS": the N-th op (from 0) of a communicator starts MS ms
//                                  late on its stream, abort or not (a kernel that keeps running
//                                  after the host gave up on it); once per process
//   TUTTI_STANDIN_NCCL_INIT_ERROR  "R": initialising NCCL rank R fails with ncclSystemError,
//                                  once per process
//   TUTTI_STANDIN_NCCL_SHRINK_ERROR "R": ncclCommShrink called by NCCL rank R (of the parent)
//                                  fails with ncclSystemError, once per process
//   TUTTI_STANDIN_TAG              names this job's shared-memory segments
//                                  (/dev/shm/tutti-standin-<tag>-...; default: the pid of the
//                                  process that made the unique id)
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "nccl_clique.h"
#include "nccl_reduce.h"
#include "standin.h"

namespace {

using tutti::standin::Clique;
using tutti::standin::Transfer;
using Clock = std::chrono::steady_clock;

constexpr char kIdMagic[] = "tutti-standin-id";  // 16 bytes and the terminator

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// "N" or "N:R" -> {N, R}, R = -1 for any rank; {-1, -1} when unset.
std::pair<int, int> env_op_rank(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return {-1, -1};
  const char* colon = std::strchr(v, ':');
  return {std::atoi(v), colon != nullptr ? std::atoi(colon + 1) : -1};
}

std::atomic<bool> g_async_error_fired{false};
std::atomic<bool> g_stall_fired{false};
std::atomic<bool> g_init_error_fired{false};
std::atomic<bool> g_shrink_error_fired{false};

struct Comm {
  int rank = 0;
  int nranks = 0;
  int device = 0;
  uint64_t bus = 0;
  bool blocking = true;
  std::string segment;
  std::shared_ptr<Clique> clique;  // set by the init thread before the state leaves InProgress

  std::atomic<bool> aborted{false};  // aborted or revoked: what runs or waits stops
  std::atomic<bool> revoked{false};
  std::atomic<int> callers{0};  // threads inside an NCCL call on this communicator
  std::thread init;

  std::mutex m;  // guards what follows
  std::condition_variable cv;
  ncclResult_t state = ncclInProgress;  // init or a launch still under way, ncclSuccess, an error
  std::string last_error;
  int outstanding = 0;  // host functions queued and not yet finished
  int deferred = 0;     // launches a non-blocking group end left for later, not yet done
  uint64_t ops_run = 0;
  bool finalizing = false;
  int shrinks = 0;  // names the n-th shrunk communicator's segment

  bool quiescent() const { return outstanding == 0 && deferred == 0; }  // the caller holds m

  void fail(ncclResult_t r, const std::string& why) {
    std::lock_guard<std::mutex> lock(m);
    if (state == ncclSuccess || state == ncclInProgress) state = r;
    last_error = why;
    cv.notify_all();
  }
};

// Everything the library knows; never destroyed (threads may still run at process exit).
struct Library {
  std::mutex m;
  std::unordered_map<uintptr_t, std::shared_ptr<Comm>> comms;  // by handle, never reused
  uintptr_t next_handle = 0x1000;
  std::atomic<int> concurrent_calls{0};
  std::atomic<int> shrinks{0};  // communicators made by ncclCommShrink
  int delay_ms = env_int("TUTTI_STANDIN_NCCL_DELAY_MS", 2);
  std::pair<int, int> async_error = env_op_rank("TUTTI_STANDIN_NCCL_ASYNC_ERROR");
  std::pair<int, int> stall = env_op_rank("TUTTI_STANDIN_NCCL_STALL");  // op, ms
  int init_error_rank = env_int("TUTTI_STANDIN_NCCL_INIT_ERROR", -1);
  int shrink_error_rank = env_int("TUTTI_STANDIN_NCCL_SHRINK_ERROR", -1);

  // Launches that non-blocking group ends leave for later.
  std::condition_variable launch_cv;
  std::multimap<Clock::time_point, std::function<void()>> launches;
  std::thread launcher;

  Library() {
    launcher = std::thread([this] {
      std::unique_lock<std::mutex> lock(m);
      while (true) {
        if (launches.empty()) {
          launch_cv.wait(lock);
          continue;
        }
        auto first = launches.begin();
        if (Clock::now() < first->first) {
          launch_cv.wait_until(lock, first->first);
          continue;
        }
        std::function<void()> fn = std::move(first->second);
        launches.erase(first);
        lock.unlock();
        fn();
        lock.lock();
      }
    });
  }
};

Library& lib() {
  static Library* l = new Library();
  return *l;
}

std::shared_ptr<Comm> find(ncclComm_t handle) {
  std::lock_guard<std::mutex> lock(lib().m);
  auto it = lib().comms.find(reinterpret_cast<uintptr_t>(handle));
  return it == lib().comms.end() ? nullptr : it->second;
}

thread_local std::string t_last_error;

ncclResult_t error(ncclResult_t r, const std::string& why) {
  t_last_error = why;
  return r;
}

// A communicator is not thread-safe: flags a second thread entering one (NCCL would corrupt it).
class Entered {
 public:
  explicit Entered(Comm& c, const char* call) : c_(c) {
    if (c_.callers.fetch_add(1) != 0) {
      lib().concurrent_calls.fetch_add(1);
      std::fprintf(stderr,
                   "[nccl stand-in] %s: another thread is inside a call on this "
                   "communicator (NCCL communicators are not thread-safe)\n",
                   call);
    }
  }
  ~Entered() { c_.callers.fetch_sub(1); }

 private:
  Comm& c_;
};

// ---- Ops -------------------------------------------------------------------------------------

enum class Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv };

struct Op {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t redop;
  int peer;  // the root, or the other end of a send or receive
  cudaStream_t stream;
};

// The work of one group on one communicator, run as a host function on its stream.
struct Task {
  std::shared_ptr<Comm> comm;
  std::vector<Op> ops;
};

bool run_collective(Comm& c, const Op& op) {
  const size_t bytes = op.count * tutti::standin::nccl_type_size(op.type);
  const int n = c.nranks;
  const int me = c.rank;
  auto in = [&](const void* p) { return const_cast<char*>(static_cast<const char*>(p)); };
  std::vector<std::vector<char>> from(n);
  std::vector<Transfer> t;
  std::vector<const void*> sources(n);
  switch (op.kind) {
    case Kind::kAllReduce:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        from[p].resize(bytes);
        t.push_back({p, true, in(op.send), bytes});
        t.push_back({p, false, from[p].data(), bytes});
      }
      if (!c.clique->exchange(me, t, c.aborted)) return false;
      for (int p = 0; p < n; ++p) sources[p] = p == me ? op.send : from[p].data();
      tutti::standin::reduce(op.recv, sources, op.count, op.type, op.redop);
      return true;
    case Kind::kReduce:
      if (me != op.peer) {
        t.push_back({op.peer, true, in(op.send), bytes});
        return c.clique->exchange(me, t, c.aborted);
      }
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        from[p].resize(bytes);
        t.push_back({p, false, from[p].data(), bytes});
      }
      if (!c.clique->exchange(me, t, c.aborted)) return false;
      for (int p = 0; p < n; ++p) sources[p] = p == me ? op.send : from[p].data();
      tutti::standin::reduce(op.recv, sources, op.count, op.type, op.redop);
      return true;
    case Kind::kBroadcast:
      if (me != op.peer) {
        t.push_back({op.peer, false, static_cast<char*>(op.recv), bytes});
        return c.clique->exchange(me, t, c.aborted);
      }
      for (int p = 0; p < n; ++p) {
        if (p != me) t.push_back({p, true, in(op.send), bytes});
      }
      if (!c.clique->exchange(me, t, c.aborted)) return false;
      if (op.recv != op.send) std::memmove(op.recv, op.send, bytes);
      return true;
    case Kind::kAllGather:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        t.push_back({p, true, in(op.send), bytes});
        t.push_back({p, false, static_cast<char*>(op.recv) + p * bytes, bytes});
      }
      if (!c.clique->exchange(me, t, c.aborted)) return false;
      std::memmove(static_cast<char*>(op.recv) + me * bytes, op.send, bytes);  // may be in place
      return true;
    case Kind::kReduceScatter:
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        from[p].resize(bytes);
        t.push_back({p, true, in(op.send) + p * bytes, bytes});
        t.push_back({p, false, from[p].data(), bytes});
      }
      if (!c.clique->exchange(me, t, c.aborted)) return false;
      for (int p = 0; p < n; ++p) {
        sources[p] = p == me ? static_cast<const char*>(op.send) + me * bytes : from[p].data();
      }
      tutti::standin::reduce(op.recv, sources, op.count, op.type, op.redop);
      return true;
    case Kind::kSend:
    case Kind::kRecv: break;
  }
  return true;
}

// Runs a task's ops in order; consecutive sends and receives move together, as in NCCL.
void run_task(void* arg) {
  std::unique_ptr<Task> task(static_cast<Task*>(arg));
  Comm& c = *task->comm;
  std::vector<Transfer> p2p;
  auto flush = [&] {
    const bool ok = p2p.empty() || c.clique->exchange(c.rank, p2p, c.aborted);
    p2p.clear();
    return ok;
  };
  bool ok = true;
  for (const Op& op : task->ops) {
    uint64_t index;
    {
      std::lock_guard<std::mutex> lock(c.m);
      ok = ok && !c.aborted.load() && (c.state == ncclSuccess || c.state == ncclInProgress);
      index = c.ops_run++;
    }
    if (!ok) break;
    const auto [stall_op, stall_ms] = lib().stall;
    if (static_cast<int64_t>(index) == stall_op && stall_ms > 0 && !g_stall_fired.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
      if (c.aborted.load()) {
        ok = false;
        break;
      }
    }
    const auto [error_op, error_rank] = lib().async_error;
    if (static_cast<int64_t>(index) == error_op && (error_rank < 0 || error_rank == c.rank) &&
        !g_async_error_fired.exchange(true)) {
      // As on a GPU, the error comes while the op runs: a while after its enqueue completed.
      std::unique_lock<std::mutex> lock(c.m);
      while (c.state == ncclInProgress && !c.aborted.load()) {
        c.cv.wait_for(lock, std::chrono::milliseconds(10));
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(lib().delay_ms));
      c.fail(ncclRemoteError,
             "injected asynchronous error (TUTTI_STANDIN_NCCL_ASYNC_ERROR) at op " +
                 std::to_string(index) + " on rank " + std::to_string(c.rank));
      // A lost peer: the op never finishes on its own.
      while (!c.aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ok = false;
      break;
    }
    const size_t bytes = op.count * tutti::standin::nccl_type_size(op.type);
    if (op.kind == Kind::kSend || op.kind == Kind::kRecv) {
      p2p.push_back(
          {op.peer, op.kind == Kind::kSend,
           const_cast<char*>(static_cast<const char*>(op.kind == Kind::kSend ? op.send : op.recv)),
           bytes});
      continue;
    }
    ok = flush() && run_collective(c, op);
  }
  if (ok) flush();
  std::lock_guard<std::mutex> lock(c.m);
  --c.outstanding;
  c.cv.notify_all();
}

// Puts each communicator's ops on its stream (the caller's thread holds no comm lock).
void launch(const std::vector<std::shared_ptr<Task>>& tasks) {
  int previous = 0;
  cudaGetDevice(&previous);
  for (const auto& t : tasks) {
    // Stream 0 means the legacy stream of the communicator's device.
    cudaSetDevice(t->comm->device);
    {
      std::lock_guard<std::mutex> lock(t->comm->m);
      ++t->comm->outstanding;
    }
    auto* owned = new Task(*t);
    if (cudaLaunchHostFunc(t->ops[0].stream, run_task, owned) != cudaSuccess) {
      delete owned;
      t->comm->fail(ncclUnhandledCudaError, "cudaLaunchHostFunc failed");
      std::lock_guard<std::mutex> lock(t->comm->m);
      --t->comm->outstanding;
    }
  }
  cudaSetDevice(previous);
}

// ---- Groups ----------------------------------------------------------------------------------

struct Pending {
  std::shared_ptr<Comm> comm;
  Op op;
};
thread_local int t_group_depth = 0;
thread_local ncclResult_t t_group_error = ncclSuccess;  // a call in the group failed
thread_local std::vector<Pending> t_group_ops;
thread_local std::vector<std::shared_ptr<Comm>> t_group_inits;

ncclResult_t wait_init(Comm& c) {
  std::unique_lock<std::mutex> lock(c.m);
  c.cv.wait(lock, [&] { return c.state != ncclInProgress; });
  if (c.state != ncclSuccess) t_last_error = c.last_error;
  return c.state;
}

// Issues what a group collected: each communicator's ops (in call order, one task per
// communicator and stream) go on their streams now (blocking communicators) or after the
// configured delay (non-blocking ones, which answer ncclInProgress until then).
ncclResult_t end_group(std::vector<Pending> ops, std::vector<std::shared_ptr<Comm>> inits) {
  ncclResult_t result = ncclSuccess;
  for (auto& c : inits) {
    const ncclResult_t r = c->blocking ? wait_init(*c) : ncclInProgress;
    if (result == ncclSuccess || result == ncclInProgress) result = r == ncclSuccess ? result : r;
  }
  if (ops.empty()) return result;
  std::vector<std::shared_ptr<Task>> tasks;
  bool nonblocking = false;
  bool blocking = false;
  for (auto& p : ops) {
    (p.comm->blocking ? blocking : nonblocking) = true;
    auto it = std::find_if(tasks.begin(), tasks.end(), [&](const std::shared_ptr<Task>& t) {
      return t->comm == p.comm && t->ops[0].stream == p.op.stream;
    });
    if (it == tasks.end()) {
      tasks.push_back(std::make_shared<Task>());
      tasks.back()->comm = p.comm;
      it = tasks.end() - 1;
    }
    (*it)->ops.push_back(p.op);
  }
  if (blocking && nonblocking) {
    return error(ncclInvalidUsage, "a group mixes blocking and non-blocking communicators");
  }
  if (blocking) {
    launch(tasks);
    return result;
  }
  for (auto& t : tasks) {
    std::lock_guard<std::mutex> lock(t->comm->m);
    if (t->comm->state == ncclSuccess) t->comm->state = ncclInProgress;
    ++t->comm->deferred;
  }
  Library& l = lib();
  {
    std::lock_guard<std::mutex> lock(l.m);
    l.launches.emplace(Clock::now() + std::chrono::milliseconds(l.delay_ms), [tasks] {
      // Like NCCL's abort, which ends a non-blocking communicator's enqueue still under way
      // before it returns: an aborted communicator's ops never reach its stream (the caller may
      // destroy the stream once the abort returned), and an abort waits for a launch under way.
      std::vector<std::shared_ptr<Task>> live;
      for (auto& t : tasks) {
        if (!t->comm->aborted.load()) live.push_back(t);
      }
      launch(live);
      for (auto& t : tasks) {
        std::lock_guard<std::mutex> lock(t->comm->m);
        if (t->comm->state == ncclInProgress) t->comm->state = ncclSuccess;
        --t->comm->deferred;
        t->comm->cv.notify_all();
      }
    });
  }
  l.launch_cv.notify_all();
  return ncclInProgress;
}

ncclResult_t check_and_enqueue(ncclComm_t handle, Op op, const char* call);

// Checks an op's arguments as NCCL would, then collects it (in a group) or issues it. As in
// NCCL, a call that fails inside a group fails the whole group: its end issues nothing.
ncclResult_t enqueue(ncclComm_t handle, Op op, const char* call) {
  const ncclResult_t r = check_and_enqueue(handle, op, call);
  if (r != ncclSuccess && r != ncclInProgress && t_group_depth > 0) t_group_error = r;
  return r;
}

ncclResult_t check_and_enqueue(ncclComm_t handle, Op op, const char* call) {
  auto c = find(handle);
  if (c == nullptr) return error(ncclInvalidArgument, std::string(call) + ": invalid communicator");
  Entered entered(*c, call);
  {
    std::lock_guard<std::mutex> lock(c->m);
    if (c->state == ncclInProgress) {
      return error(ncclInvalidUsage, std::string(call) +
                                         ": the communicator is still in progress (poll "
                                         "ncclCommGetAsyncError until ncclSuccess first)");
    }
    if (c->revoked.load()) {
      return error(ncclInvalidUsage, std::string(call) + ": the communicator was revoked");
    }
    if (c->state != ncclSuccess) return error(c->state, std::string(call) + ": " + c->last_error);
  }
  if (op.type < 0 || tutti::standin::nccl_type_size(op.type) == 0) {
    return error(ncclInvalidArgument,
                 std::string(call) + ": unsupported data type " + std::to_string(op.type));
  }
  if (op.redop < 0 || op.redop >= ncclNumOps) {
    return error(ncclInvalidArgument, std::string(call) + ": invalid reduction op");
  }
  if (op.peer < 0 || op.peer >= c->nranks) {
    return error(ncclInvalidArgument, std::string(call) + ": root or peer " +
                                          std::to_string(op.peer) + " is not a rank of " +
                                          std::to_string(c->nranks));
  }
  if (op.stream != nullptr) {
    int stream_device = -1;
    if (cudaStreamGetDevice(op.stream, &stream_device) != cudaSuccess) {
      return error(ncclInvalidArgument, std::string(call) + ": invalid stream");
    }
    if (stream_device != c->device) {
      return error(ncclInvalidArgument, std::string(call) + ": the stream belongs to device " +
                                            std::to_string(stream_device) +
                                            ", the communicator to " + std::to_string(c->device));
    }
  }
  const size_t bytes = op.count * tutti::standin::nccl_type_size(op.type);
  size_t send_bytes = bytes, recv_bytes = bytes;
  if (op.kind == Kind::kAllGather) recv_bytes = bytes * c->nranks;
  if (op.kind == Kind::kReduceScatter) send_bytes = bytes * c->nranks;
  const bool sends = op.kind != Kind::kRecv && !(op.kind == Kind::kBroadcast && c->rank != op.peer);
  const bool receives =
      op.kind != Kind::kSend && !((op.kind == Kind::kReduce) && c->rank != op.peer);
  auto device_memory = [&](const void* p, size_t n) {
    if (n == 0) return true;
    for (const char* q : {static_cast<const char*>(p), static_cast<const char*>(p) + n - 1}) {
      cudaPointerAttributes a;
      if (cudaPointerGetAttributes(&a, q) != cudaSuccess || a.type != cudaMemoryTypeDevice ||
          a.device != c->device) {
        return false;
      }
    }
    return true;
  };
  if ((sends && !device_memory(op.send, send_bytes)) ||
      (receives && !device_memory(op.recv, recv_bytes))) {
    return error(ncclInvalidArgument, std::string(call) +
                                          ": a buffer is not device memory of "
                                          "the communicator's device " +
                                          std::to_string(c->device));
  }
  if (op.count == 0) return ncclSuccess;
  if (t_group_depth > 0) {
    t_group_ops.push_back({c, op});
    return ncclSuccess;
  }
  return end_group({{c, op}}, {});
}

void init_thread(std::shared_ptr<Comm> c) {
  std::string why;
  std::shared_ptr<Clique> clique;
  ncclResult_t r =
      Clique::attach(c->segment, c->nranks, c->rank, c->bus, c->aborted, &clique, &why);
  if (r == ncclSuccess) {
    {
      std::lock_guard<std::mutex> lock(c->m);
      c->clique = clique;
    }
    r = clique->wait_for_all(c->rank, c->aborted, &why);
  }
  // "For a while": a non-blocking init keeps answering ncclInProgress.
  const auto until = Clock::now() + std::chrono::milliseconds(lib().delay_ms);
  while (r == ncclSuccess && !c->blocking && Clock::now() < until && !c->aborted.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r == ncclSuccess && c->aborted.load()) r = ncclInternalError;
  if (r == ncclInternalError && why.empty()) why = "aborted during init";
  std::lock_guard<std::mutex> lock(c->m);
  c->state = r;
  c->last_error = why;
  c->cv.notify_all();
}

// Gives a communicator whose init has started its handle; what the init call returns.
ncclResult_t publish(const std::shared_ptr<Comm>& c, ncclComm_t* comm) {
  {
    std::lock_guard<std::mutex> lock(lib().m);
    const uintptr_t handle = lib().next_handle += 0x10;
    lib().comms[handle] = c;
    *comm = reinterpret_cast<ncclComm_t>(handle);
  }
  if (t_group_depth > 0) {  // finished (blocking) or reported (non-blocking) at the group's end
    t_group_inits.push_back(c);
    return ncclSuccess;
  }
  return c->blocking ? wait_init(*c) : ncclInProgress;
}

}  // namespace

// ---- The API ---------------------------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return error(ncclInvalidArgument, "ncclGetUniqueId: null id");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
  const char* tag = std::getenv("TUTTI_STANDIN_TAG");
  std::string name =
      "/tutti-standin-" +
      (tag != nullptr && *tag != '\0' ? std::string(tag) : std::to_string(::getpid())) + "-";
  std::random_device random;
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) name += kHex[random() % 16];
  if (name.size() >= sizeof(id->internal) - sizeof(kIdMagic)) {
    return error(ncclInvalidArgument, "ncclGetUniqueId: TUTTI_STANDIN_TAG is too long");
  }
  std::memcpy(id->internal + sizeof(kIdMagic), name.c_str(), name.size() + 1);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return error(ncclInvalidArgument, "ncclCommInitRankConfig: null comm");
  *comm = nullptr;
  if (::dlsym(RTLD_DEFAULT, "tutti_standin_cuda_live_streams") == nullptr) {
    return error(ncclSystemError,
                 "the stand-in NCCL needs the stand-in CUDA runtime: put "
                 "tests/standin's libcudart.so.13 first on LD_LIBRARY_PATH");
  }
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0) {
    return error(ncclInvalidArgument, "ncclCommInitRankConfig: not a unique id of this library");
  }
  if (nranks < 1 || nranks > Clique::kMaxRanks || rank < 0 || rank >= nranks) {
    return error(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                          " of " + std::to_string(nranks));
  }
  if (config != nullptr && config->magic != 0xcafebeef) {
    return error(ncclInvalidArgument,
                 "ncclCommInitRankConfig: config not initialised with "
                 "NCCL_CONFIG_INITIALIZER");
  }
  auto c = std::make_shared<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->blocking =
      config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  c->segment.assign(id.internal + sizeof(kIdMagic));
  if (cudaGetDevice(&c->device) != cudaSuccess) {
    return error(ncclUnhandledCudaError, "ncclCommInitRankConfig: no current device");
  }
  char bus[32] = {0};
  cudaDeviceGetPCIBusId(bus, sizeof(bus), c->device);
  c->bus = std::hash<std::string>()(bus) | 1;
  if (rank == lib().init_error_rank && !g_init_error_fired.exchange(true)) {
    c->fail(ncclSystemError, "injected init failure (TUTTI_STANDIN_NCCL_INIT_ERROR) on rank " +
                                 std::to_string(rank));
  } else {
    c->init = std::thread(init_thread, c);
  }
  return publish(c, comm);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  auto c = find(comm);
  if (c == nullptr || result == nullptr) {
    return error(ncclInvalidArgument, "ncclCommGetAsyncError: invalid communicator");
  }
  Entered entered(*c, "ncclCommGetAsyncError");
  std::lock_guard<std::mutex> lock(c->m);
  if (c->revoked.load()) {  // in progress until what ran on it has stopped
    *result = c->quiescent() ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
  }
  *result = c->state;
  if (c->state == ncclSuccess && c->finalizing && c->outstanding > 0) *result = ncclInProgress;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  auto c = find(comm);
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommFinalize: invalid communicator");
  Entered entered(*c, "ncclCommFinalize");
  if (c->revoked.load()) {
    return error(ncclInvalidUsage, "ncclCommFinalize: the communicator was revoked (abort it)");
  }
  std::unique_lock<std::mutex> lock(c->m);
  c->finalizing = true;
  if (!c->blocking) return c->outstanding > 0 ? ncclInProgress : ncclSuccess;
  c->cv.wait(lock, [&] { return c->outstanding == 0; });
  return ncclSuccess;
}

namespace {
// Takes the communicator out of the table: its handle is dead from here on.
std::shared_ptr<Comm> take(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(lib().m);
  auto it = lib().comms.find(reinterpret_cast<uintptr_t>(comm));
  if (it == lib().comms.end()) return nullptr;
  auto c = std::move(it->second);
  lib().comms.erase(it);
  return c;
}

// Stops the init thread and lets the clique go (queued work keeps its own reference).
void release(Comm& c) {
  c.aborted.store(true);
  if (c.init.joinable()) c.init.join();
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(c.m);
    clique = c.clique;
  }
  if (clique != nullptr) clique->give_up();
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto c = take(comm);
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  Entered entered(*c, "ncclCommDestroy");
  {
    // Waits for the communicator's work, as NCCL does.
    std::unique_lock<std::mutex> lock(c->m);
    c->cv.wait(lock, [&] { return c->outstanding == 0; });
  }
  release(*c);
  return ncclSuccess;
}

// May come from any thread, while another is inside a call on the communicator.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto c = take(comm);
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
  c->aborted.store(true);
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(c->m);
    clique = c->clique;
  }
  if (clique != nullptr) clique->ring(c->rank);
  release(*c);
  {
    // A deferred launch that saw the communicator before the abort finishes putting its ops on
    // the stream first.
    std::unique_lock<std::mutex> lock(c->m);
    c->cv.wait(lock, [&] { return c->deferred == 0; });
  }
  if (c->nranks > 1) {
    // Like NCCL's abort (NVIDIA/nccl#829): waits for work queued behind a stalled stream.
    std::unique_lock<std::mutex> lock(c->m);
    c->cv.wait(lock, [&] { return c->outstanding == 0; });
  }
  return ncclSuccess;
}

// Stops what runs on the communicator (as abort does) and keeps it, for ncclCommShrink.
ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  auto c = find(comm);
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommRevoke: invalid communicator");
  if (flags != NCCL_REVOKE_DEFAULT) {
    return error(ncclInvalidArgument, "ncclCommRevoke: flags must be NCCL_REVOKE_DEFAULT");
  }
  Entered entered(*c, "ncclCommRevoke");
  c->revoked.store(true);
  c->aborted.store(true);
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(c->m);
    clique = c->clique;
    c->cv.notify_all();
  }
  if (clique != nullptr) clique->ring(c->rank);
  return ncclSuccess;
}

// Only the ranks that stay call it: each attaches to a clique named after the parent's and the
// number of shrinks of it so far, as rank (its rank - the excluded ranks below it).
ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int count, ncclComm_t* newcomm,
                            ncclConfig_t* config, int flags) {
  if (newcomm == nullptr) return error(ncclInvalidArgument, "ncclCommShrink: null newcomm");
  *newcomm = nullptr;
  auto c = find(comm);
  if (c == nullptr) return error(ncclInvalidArgument, "ncclCommShrink: invalid communicator");
  Entered entered(*c, "ncclCommShrink");
  if (count < 0 || (count > 0 && exclude == nullptr) || count >= c->nranks) {
    return error(ncclInvalidArgument, "ncclCommShrink: " + std::to_string(count) +
                                          " excluded ranks of " + std::to_string(c->nranks));
  }
  if ((flags & ~NCCL_SHRINK_ABORT) != 0) {
    return error(ncclInvalidArgument, "ncclCommShrink: unknown flags " + std::to_string(flags));
  }
  if (config != nullptr && config->magic != 0xcafebeef) {
    return error(ncclInvalidArgument,
                 "ncclCommShrink: config not initialised with NCCL_CONFIG_INITIALIZER");
  }
  std::vector<bool> out(c->nranks, false);
  int below = 0;
  for (int i = 0; i < count; ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= c->nranks || out[r]) {
      return error(ncclInvalidArgument, "ncclCommShrink: excluded rank " + std::to_string(r) +
                                            " is out of range or listed twice");
    }
    if (r == c->rank) {
      return error(ncclInvalidUsage, "ncclCommShrink: rank " + std::to_string(r) +
                                         " is excluded and must not call it");
    }
    out[r] = true;
    if (r < c->rank) ++below;
  }
  if (c->rank == lib().shrink_error_rank && !g_shrink_error_fired.exchange(true)) {
    return error(ncclSystemError,
                 "injected shrink failure (TUTTI_STANDIN_NCCL_SHRINK_ERROR) on "
                 "rank " +
                     std::to_string(c->rank));
  }
  const bool abort_first = (flags & NCCL_SHRINK_ABORT) != 0;
  std::string segment;
  {
    std::unique_lock<std::mutex> lock(c->m);
    if (!abort_first && !c->quiescent()) {
      return error(ncclInvalidUsage,
                   "ncclCommShrink: NCCL_SHRINK_DEFAULT with operations in flight (revoke the "
                   "communicator and wait for ncclSuccess, or pass NCCL_SHRINK_ABORT)");
    }
    if (!abort_first && !c->revoked.load() && c->state != ncclSuccess) {
      return error(c->state, "ncclCommShrink: " + c->last_error);
    }
    segment = c->segment + ".s" + std::to_string(c->shrinks++);
  }
  if (abort_first) {
    c->revoked.store(true);
    c->aborted.store(true);
    std::shared_ptr<Clique> clique;
    {
      std::lock_guard<std::mutex> lock(c->m);
      clique = c->clique;
    }
    if (clique != nullptr) clique->ring(c->rank);
    std::unique_lock<std::mutex> lock(c->m);
    c->cv.wait(lock, [&] { return c->quiescent(); });
  }
  auto n = std::make_shared<Comm>();
  n->rank = c->rank - below;
  n->nranks = c->nranks - count;
  n->device = c->device;
  n->bus = c->bus;
  n->blocking = config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT
                    ? c->blocking
                    : config->blocking != 0;
  n->segment = segment;
  n->init = std::thread(init_thread, n);
  lib().shrinks.fetch_add(1);
  return publish(n, newcomm);
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  auto c = comm != nullptr ? find(comm) : nullptr;
  if (c != nullptr) {
    std::lock_guard<std::mutex> lock(c->m);
    copy = c->last_error.empty() ? t_last_error : c->last_error;
  } else {
    copy = t_last_error;
  }
  return copy.c_str();
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Pending> ops = std::move(t_group_ops);
  std::vector<std::shared_ptr<Comm>> inits = std::move(t_group_inits);
  t_group_ops.clear();
  t_group_inits.clear();
  const ncclResult_t failed = t_group_error;
  t_group_error = ncclSuccess;
  if (failed != ncclSuccess) return failed;  // nothing of the group is issued
  return end_group(std::move(ops), std::move(inits));
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kAllReduce, send, recv, count, type, op, 0, stream}, "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kBroadcast, send, recv, count, type, ncclSum, root, stream},
                 "ncclBroadcast");
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kReduce, send, recv, count, type, op, root, stream}, "ncclReduce");
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kAllGather, send, recv, count, type, ncclSum, 0, stream},
                 "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kReduceScatter, send, recv, count, type, op, 0, stream},
                 "ncclReduceScatter");
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, {Kind::kSend, send, nullptr, count, type, ncclSum, peer, stream},
                 "ncclSend");
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueue(comm, {Kind::kRecv, nullptr, recv, count, type, ncclSum, peer, stream},
                 "ncclRecv");
}

int tutti_standin_nccl_live_comms(void) {
  std::lock_guard<std::mutex> lock(lib().m);
  return static_cast<int>(lib().comms.size());
}

int tutti_standin_nccl_shrinks(void) {
  return lib().shrinks.load();
}

int tutti_standin_nccl_concurrent_calls(void) {
  return lib().concurrent_calls.load();
}
