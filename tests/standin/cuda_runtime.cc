// A stand-in for the CUDA runtime (libcudart.so.13), for tests only: never installed.
//
// It implements the entry points that tutti's NCCL backend, its tests, examples and benchmark,
// and the stand-in NCCL call, with CUDA's documented semantics on the CPU:
// - Devices: TUTTI_STANDIN_DEVICES of them (default 4; 0 means none, as on a machine without a
//   GPU), each with a stable PCI bus id. The current device is per thread, 0 at first.
// - Memory: device memory is host memory. cudaFree and cudaFreeHost first wait for all work
//   queued on the device (CUDA: they "may perform implicit synchronization"); cudaFreeAsync
//   frees in stream order.
// - Streams: each stream is a worker thread that runs its queued work in order. Handle 0 (and
//   cudaStreamLegacy, cudaStreamPerThread) is the device's legacy default stream, which
//   synchronises with the device's blocking streams; cudaStreamNonBlocking streams do not.
//   A destroyed stream finishes its queued work, then goes.
// - Events: a record marks a point in a stream; query, synchronize, cudaStreamWaitEvent and
//   cudaEventElapsedTime refer to the most recent record. An event belongs to the device that
//   was current at its creation and is recorded only on that device's streams.
// - Handles are never reused, so a call on a destroyed stream or event reliably fails with
//   cudaErrorInvalidResourceHandle (and is counted: tutti_standin_cuda_bad_handles).
// - IPC: device memory is a memfd mapping, so cudaIpcGetMemHandle names it (pid, descriptor,
//   size, buffer id) and another process's cudaIpcOpenMemHandle maps it through /proc/<pid>/fd
//   (as with CUDA, not in the exporting process). A record of an interprocess event waits on the
//   host for the stream to reach it, so an event opened from its handle is always complete: the
//   ordering CUDA gives a consumer's stream, reached conservatively. The driver's
//   cuMemGetAddressRange and cuPointerGetAttribute (buffer id) come from
//   cudaGetDriverEntryPointByVersion. Each device has a fixed UUID.
// Thread-safe throughout. Host functions run on the stream's worker thread.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "standin.h"

namespace {

using Clock = std::chrono::steady_clock;

// A point in a stream: set once the work queued before it has run.
struct Mark {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Clock::time_point at;

  void set() {
    std::lock_guard<std::mutex> lock(m);
    at = Clock::now();
    done = true;
    cv.notify_all();
  }
  bool is_set() {
    std::lock_guard<std::mutex> lock(m);
    return done;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done; });
  }
};

struct Stream {
  int device = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  bool legacy = false;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> work;
  uint64_t queued = 0;
  uint64_t completed = 0;
  bool closing = false;
  std::thread worker;

  void push(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(m);
    work.push_back(std::move(fn));
    ++queued;
    cv.notify_all();
  }
  std::shared_ptr<Mark> mark() {
    auto mark = std::make_shared<Mark>();
    push([mark] { mark->set(); });
    return mark;
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(m);
    return completed == queued;
  }
};

// The worker owns a reference, so a destroyed stream lives until its queue is drained.
void run_stream(std::shared_ptr<Stream> s) {
  std::unique_lock<std::mutex> lock(s->m);
  while (true) {
    s->cv.wait(lock, [&] { return !s->work.empty() || s->closing; });
    if (s->work.empty()) return;
    std::function<void()> fn = std::move(s->work.front());
    s->work.pop_front();
    lock.unlock();
    fn();
    lock.lock();
    ++s->completed;
    s->cv.notify_all();
  }
}

std::shared_ptr<Stream> start_stream(int device, bool blocking, bool legacy) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->blocking = blocking;
  s->legacy = legacy;
  s->worker = std::thread(run_stream, s);
  return s;
}

struct Event {
  int device = 0;
  bool timing = true;
  bool interprocess = false;
  std::shared_ptr<Mark> last;  // the most recent record; null until recorded
};

struct Allocation {
  size_t bytes = 0;
  int device = 0;
  bool pinned = false;  // cudaMallocHost
  int fd = -1;          // device memory: its memfd
  size_t mapped = 0;    // device memory: the mapping's length
  uint64_t buffer_id = 0;
  bool opened = false;  // mapped by cudaIpcOpenMemHandle
};

// What an IPC handle holds (in its 64 bytes).
struct IpcMem {
  char magic[4];
  int32_t pid;
  int32_t fd;
  uint64_t mapped;
  uint64_t buffer_id;
};
struct IpcEvent {
  char magic[4];
  int32_t pid;
  uint64_t handle;
};

// Everything the runtime knows; deliberately never destroyed (worker threads may still run at
// process exit).
struct Runtime {
  std::mutex m;
  int devices = 4;
  std::vector<std::shared_ptr<Stream>> legacy;                     // by device
  std::unordered_map<uintptr_t, std::shared_ptr<Stream>> streams;  // by handle
  std::unordered_map<uintptr_t, std::shared_ptr<Event>> events;    // by handle
  std::map<uintptr_t, Allocation> allocations;                     // by base address
  uintptr_t next_handle = 0x1000;
  std::atomic<int> bad_handles{0};
  std::atomic<int> ipc_opens{0};
  uint64_t next_buffer = 0;

  Runtime() {
    if (const char* env = std::getenv("TUTTI_STANDIN_DEVICES")) devices = std::atoi(env);
    if (devices < 0) devices = 0;
    for (int d = 0; d < devices; ++d) legacy.push_back(start_stream(d, true, true));
  }
  uintptr_t new_handle() { return next_handle += 0x10; }  // never reused
};

Runtime& rt() {
  static Runtime* runtime = new Runtime();
  return *runtime;
}

// Initial-exec: where this library is dlopen'ed (builds against the declared CUDA headers load
// the runtime at run time), LeakSanitizer of LLVM 14 crashes at exit on a dlopen'ed library's
// dynamic TLS under glibc 2.36; static TLS it reads.
__attribute__((tls_model("initial-exec"))) thread_local int current_device = 0;

cudaError_t bad_handle(const char* call) {
  rt().bad_handles.fetch_add(1);
  std::fprintf(stderr, "[cuda stand-in] %s on a destroyed or unknown handle\n", call);
  return cudaErrorInvalidResourceHandle;
}

// Resolves a stream handle (0 and the two special handles mean the current device's legacy
// default stream); null for a destroyed or unknown handle.
std::shared_ptr<Stream> find_stream(cudaStream_t handle) {
  Runtime& r = rt();
  const auto key = reinterpret_cast<uintptr_t>(handle);
  std::lock_guard<std::mutex> lock(r.m);
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    return current_device < r.devices ? r.legacy[current_device] : nullptr;
  }
  auto it = r.streams.find(key);
  return it == r.streams.end() ? nullptr : it->second;
}

std::shared_ptr<Event> find_event(cudaEvent_t handle) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.events.find(reinterpret_cast<uintptr_t>(handle));
  return it == r.events.end() ? nullptr : it->second;
}

// Queues work on s with the legacy default stream's implicit synchronisation: work on the
// legacy stream waits for the device's blocking streams, and theirs for the legacy stream.
void enqueue(const std::shared_ptr<Stream>& s, std::function<void()> fn) {
  std::vector<std::shared_ptr<Stream>> before;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    if (s->legacy) {
      for (auto& [handle, other] : r.streams) {
        if (other->device == s->device && other->blocking) before.push_back(other);
      }
    } else if (s->blocking) {
      before.push_back(r.legacy[s->device]);
    }
  }
  for (auto& other : before) {
    auto mark = other->mark();
    s->push([mark] { mark->wait(); });
  }
  s->push(std::move(fn));
}

// Waits until every stream of the device has run what was queued on it so far.
void synchronize_device(int device) {
  std::vector<std::shared_ptr<Stream>> all;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    if (device >= r.devices) return;
    all.push_back(r.legacy[device]);
    for (auto& [handle, s] : r.streams) {
      if (s->device == device) all.push_back(s);
    }
  }
  for (auto& s : all) s->mark()->wait();
}

void drop(void* ptr, const Allocation& a) {
  if (a.fd >= 0 || a.opened) {
    ::munmap(ptr, a.mapped);
    if (a.fd >= 0) ::close(a.fd);
  } else {
    std::free(ptr);
  }
}

cudaError_t release(void* ptr, bool pinned) {
  if (ptr == nullptr) return cudaSuccess;
  Allocation a;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.allocations.end() || it->second.pinned != pinned || it->second.opened) {
      return cudaErrorInvalidValue;
    }
    a = it->second;
  }
  synchronize_device(a.device);
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    r.allocations.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  drop(ptr, a);
  return cudaSuccess;
}

cudaError_t allocate(void** ptr, size_t bytes, int device, bool pinned) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  const size_t rounded = (bytes + 255) / 256 * 256 + 256;
  Allocation a{bytes, device, pinned};
  void* p = nullptr;
  if (pinned) {
    p = std::aligned_alloc(256, rounded);
  } else {
    // Shareable with another process (cudaIpcGetMemHandle).
    a.fd = ::memfd_create("cuda-standin", MFD_CLOEXEC);
    if (a.fd >= 0 && ::ftruncate(a.fd, static_cast<off_t>(rounded)) == 0) {
      p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
      if (p == MAP_FAILED) p = nullptr;
    }
    if (p == nullptr && a.fd >= 0) ::close(a.fd);
    a.mapped = rounded;
  }
  if (p == nullptr) return cudaErrorMemoryAllocation;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  a.buffer_id = ++r.next_buffer;
  r.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  *ptr = p;
  return cudaSuccess;
}

}  // namespace

// ---- Devices ---------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = rt().devices;
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  if (rt().devices == 0) return cudaErrorNoDevice;
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (rt().devices == 0) return cudaErrorNoDevice;
  if (device < 0 || device >= rt().devices) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (id == nullptr || len <= 0) return cudaErrorInvalidValue;
  if (device < 0 || device >= rt().devices) return cudaErrorInvalidDevice;
  std::snprintf(id, static_cast<size_t>(len), "0000:%02X:00.0", 0x18 + device);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  synchronize_device(current_device);
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  return cudaRuntimeGetVersion(version);
}

cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}

// ---- Memory ----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (rt().devices == 0) return cudaErrorNoDevice;
  return allocate(ptr, bytes, current_device, false);
}
cudaError_t cudaFree(void* ptr) {
  return release(ptr, false);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return allocate(ptr, bytes, current_device, true);
}
cudaError_t cudaFreeHost(void* ptr) {
  return release(ptr, true);
}

// Stream-ordered: the memory (of the stream's device) is usable by work queued on the stream
// from now on, and cudaFreeAsync frees it once the stream reaches the free.
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaMallocAsync");
  return allocate(ptr, bytes, s->device, false);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaFreeAsync");
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.allocations.end() || it->second.pinned || it->second.opened) {
      return cudaErrorInvalidValue;
    }
  }
  enqueue(s, [ptr] {
    Allocation a;
    {
      std::lock_guard<std::mutex> lock(rt().m);
      auto it = rt().allocations.find(reinterpret_cast<uintptr_t>(ptr));
      a = it->second;
      rt().allocations.erase(it);
    }
    drop(ptr, a);
  });
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return cudaErrorInvalidValue;
  std::memset(attr, 0, sizeof(*attr));
  attr->type = cudaMemoryTypeUnregistered;
  attr->device = -2;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return cudaSuccess;
  --it;
  if (p >= it->first + std::max<size_t>(it->second.bytes, 1)) return cudaSuccess;
  attr->type = it->second.pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  attr->device = it->second.device;
  attr->devicePointer = const_cast<void*>(ptr);
  attr->hostPointer = it->second.pinned ? const_cast<void*>(ptr) : nullptr;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return cudaErrorInvalidMemcpyDirection;
  }
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaMemcpyAsync");
  if (bytes > 0) enqueue(s, [=] { std::memcpy(dst, src, bytes); });
  return cudaSuccess;
}

// Synchronous, on the legacy default stream.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  auto s = find_stream(nullptr);
  if (s == nullptr) return cudaErrorNoDevice;
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  s->mark()->wait();
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaMemsetAsync");
  if (bytes > 0) enqueue(s, [=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

// As CUDA documents: asynchronous with respect to the host, on the legacy default stream.
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  return cudaMemsetAsync(ptr, value, bytes, nullptr);
}

// ---- Streams ---------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) return cudaErrorInvalidValue;
  Runtime& r = rt();
  if (r.devices == 0) return cudaErrorNoDevice;
  auto s = start_stream(current_device, (flags & cudaStreamNonBlocking) == 0, false);
  std::lock_guard<std::mutex> lock(r.m);
  const uintptr_t handle = r.new_handle();
  r.streams[handle] = std::move(s);
  *stream = reinterpret_cast<cudaStream_t>(handle);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::shared_ptr<Stream> s;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.streams.find(reinterpret_cast<uintptr_t>(stream));
    if (it == r.streams.end()) {
      r.bad_handles.fetch_add(1);
      std::fprintf(stderr, "[cuda stand-in] cudaStreamDestroy on a destroyed or unknown handle\n");
      return cudaErrorInvalidResourceHandle;
    }
    s = std::move(it->second);
    r.streams.erase(it);
  }
  // As CUDA documents: returns at once; the queued work still runs, then the stream goes.
  std::lock_guard<std::mutex> lock(s->m);
  s->closing = true;
  s->worker.detach();
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaStreamSynchronize");
  s->mark()->wait();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaStreamQuery");
  return s->idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaStreamGetDevice");
  *device = s->device;
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  if (fn == nullptr) return cudaErrorInvalidValue;
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaLaunchHostFunc");
  enqueue(s, [fn, data] { fn(data); });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags != 0 && flags != cudaEventWaitDefault) return cudaErrorInvalidValue;
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaStreamWaitEvent (stream)");
  auto e = find_event(event);
  if (e == nullptr) return bad_handle("cudaStreamWaitEvent (event)");
  std::shared_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lock(rt().m);
    mark = e->last;
  }
  if (mark != nullptr) s->push([mark] { mark->wait(); });  // across devices too
  return cudaSuccess;
}

// ---- Events ----------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  const unsigned int known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~known) != 0) return cudaErrorInvalidValue;
  Runtime& r = rt();
  if (r.devices == 0) return cudaErrorNoDevice;
  auto e = std::make_shared<Event>();
  e->device = current_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  e->interprocess = (flags & cudaEventInterprocess) != 0;
  if (e->interprocess && e->timing) return cudaErrorInvalidValue;  // CUDA requires DisableTiming
  std::lock_guard<std::mutex> lock(r.m);
  const uintptr_t handle = r.new_handle();
  r.events[handle] = std::move(e);
  *event = reinterpret_cast<cudaEvent_t>(handle);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

// CUDA allows destroying an event whose record has not completed yet.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  if (r.events.erase(reinterpret_cast<uintptr_t>(event)) == 0) {
    r.bad_handles.fetch_add(1);
    std::fprintf(stderr, "[cuda stand-in] cudaEventDestroy on a destroyed or unknown handle\n");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = find_event(event);
  if (e == nullptr) return bad_handle("cudaEventRecord (event)");
  auto s = find_stream(stream);
  if (s == nullptr) return bad_handle("cudaEventRecord (stream)");
  if (s->device != e->device) return cudaErrorInvalidResourceHandle;  // another device's stream
  auto mark = std::make_shared<Mark>();
  enqueue(s, [mark] { mark->set(); });
  if (e->interprocess) mark->wait();  // see the header: opened handles are then complete
  std::lock_guard<std::mutex> lock(rt().m);
  e->last = std::move(mark);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto e = find_event(event);
  if (e == nullptr) return bad_handle("cudaEventQuery");
  std::shared_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lock(rt().m);
    mark = e->last;
  }
  return mark == nullptr || mark->is_set() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto e = find_event(event);
  if (e == nullptr) return bad_handle("cudaEventSynchronize");
  std::shared_ptr<Mark> mark;
  {
    std::lock_guard<std::mutex> lock(rt().m);
    mark = e->last;
  }
  if (mark != nullptr) mark->wait();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cudaErrorInvalidValue;
  auto a = find_event(start);
  auto b = find_event(end);
  if (a == nullptr || b == nullptr) return bad_handle("cudaEventElapsedTime");
  std::shared_ptr<Mark> ma, mb;
  {
    std::lock_guard<std::mutex> lock(rt().m);
    if (!a->timing || !b->timing) return cudaErrorInvalidResourceHandle;
    ma = a->last;
    mb = b->last;
  }
  if (ma == nullptr || mb == nullptr) return cudaErrorInvalidResourceHandle;
  // A mark's time is written once, before it is set: readable once is_set() said so.
  if (!ma->is_set() || !mb->is_set()) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(mb->at - ma->at).count();
  return cudaSuccess;
}

// ---- What tests may ask ----------------------------------------------------------------------

int tutti_standin_cuda_live_streams(void) {
  std::lock_guard<std::mutex> lock(rt().m);
  return static_cast<int>(rt().streams.size());
}

int tutti_standin_cuda_live_events(void) {
  std::lock_guard<std::mutex> lock(rt().m);
  return static_cast<int>(rt().events.size());
}

int tutti_standin_cuda_bad_handles(void) {
  return rt().bad_handles.load();
}

// ---- IPC, device properties, driver entry points --------------------------------------------

namespace {

// The allocation holding ptr (any address inside it); allocations.end() when none.
std::map<uintptr_t, Allocation>::iterator containing(Runtime& r, uintptr_t p) {
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return r.allocations.end();
  --it;
  return p < it->first + std::max<size_t>(it->second.bytes, 1) ? it : r.allocations.end();
}

// CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr)
int standin_get_address_range(unsigned long long* base, size_t* size, unsigned long long ptr) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = containing(r, static_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.pinned) return 1;  // CUDA_ERROR_INVALID_VALUE
  if (base != nullptr) *base = it->first;
  if (size != nullptr) *size = it->second.bytes;
  return 0;
}

// CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr):
// only CU_POINTER_ATTRIBUTE_BUFFER_ID (7).
int standin_pointer_get_attribute(void* data, int attribute, unsigned long long ptr) {
  if (attribute != 7 || data == nullptr) return 1;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = containing(r, static_cast<uintptr_t>(ptr));
  if (it == r.allocations.end() || it->second.pinned) return 1;
  *static_cast<unsigned long long*>(data) = it->second.buffer_id;
  return 0;
}

}  // namespace

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  (void)cudaVersion;
  (void)flags;
  if (symbol == nullptr || funcPtr == nullptr) return cudaErrorInvalidValue;
  *funcPtr = nullptr;
  if (std::strcmp(symbol, "cuMemGetAddressRange") == 0) {
    *funcPtr = reinterpret_cast<void*>(&standin_get_address_range);
  } else if (std::strcmp(symbol, "cuPointerGetAttribute") == 0) {
    *funcPtr = reinterpret_cast<void*>(&standin_pointer_get_attribute);
  }
  if (driverStatus != nullptr) {
    *driverStatus =
        *funcPtr != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (device < 0 || device >= rt().devices) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "tutti stand-in device %d", device);
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = static_cast<char>(0xA0 + i * 3 + device);
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  if (handle == nullptr) return cudaErrorInvalidValue;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  auto it = r.allocations.find(reinterpret_cast<uintptr_t>(devPtr));  // the base, as CUDA asks
  if (it == r.allocations.end() || it->second.fd < 0) return cudaErrorInvalidValue;
  IpcMem m{{'T', 'S', 'I', 'M'},
           static_cast<int32_t>(::getpid()),
           it->second.fd,
           it->second.mapped,
           it->second.buffer_id};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &m, sizeof(m));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  (void)flags;
  if (devPtr == nullptr) return cudaErrorInvalidValue;
  IpcMem m;
  std::memcpy(&m, handle.reserved, sizeof(m));
  if (std::memcmp(m.magic, "TSIM", 4) != 0) return cudaErrorInvalidValue;
  if (m.pid == ::getpid()) return cudaErrorInvalidValue;  // CUDA: never in the exporting process
  const std::string path = "/proc/" + std::to_string(m.pid) + "/fd/" + std::to_string(m.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorInvalidResourceHandle;  // the exporter is gone
  void* p = ::mmap(nullptr, m.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.m);
  Allocation a;
  a.bytes = m.mapped;
  a.device = current_device;
  a.mapped = m.mapped;
  a.opened = true;
  a.buffer_id = ++r.next_buffer;
  r.allocations[reinterpret_cast<uintptr_t>(p)] = a;
  r.ipc_opens.fetch_add(1);
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  Allocation a;
  {
    Runtime& r = rt();
    std::lock_guard<std::mutex> lock(r.m);
    auto it = r.allocations.find(reinterpret_cast<uintptr_t>(devPtr));
    if (it == r.allocations.end() || !it->second.opened) return cudaErrorInvalidValue;
    a = it->second;
    r.allocations.erase(it);
  }
  ::munmap(devPtr, a.mapped);
  return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  if (handle == nullptr) return cudaErrorInvalidValue;
  auto e = find_event(event);
  if (e == nullptr) return bad_handle("cudaIpcGetEventHandle");
  if (!e->interprocess) return cudaErrorInvalidResourceHandle;
  IpcEvent h{{'T', 'S', 'I', 'E'},
             static_cast<int32_t>(::getpid()),
             static_cast<uint64_t>(reinterpret_cast<uintptr_t>(event))};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle->reserved, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  if (event == nullptr) return cudaErrorInvalidValue;
  IpcEvent h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (std::memcmp(h.magic, "TSIE", 4) != 0) return cudaErrorInvalidValue;
  // Its records completed before the exporter went on (see the header).
  const cudaError_t rc = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  if (rc == cudaSuccess) {
    auto e = find_event(*event);
    e->interprocess = true;
  }
  return rc;
}

extern "C" int tutti_standin_cuda_ipc_opens(void) {
  return rt().ipc_opens.load();
}
