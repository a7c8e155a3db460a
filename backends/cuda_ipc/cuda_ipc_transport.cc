// The "cuda_ipc" tensor transport of the direct transport (tutti/transfer_agent.h): CUDA tensors
// between processes on one host, the consumer reading the owner's GPU memory itself.
//
// Owner, at put: each tensor's allocation (its base, size and buffer id from the driver) is
// exported once with cudaIpcGetMemHandle and the handle cached by (base, buffer id), so a freed
// and reallocated address is exported again. An interprocess event is recorded on the producer's
// stream (PutOptions::stream); the ref carries the handles, each tensor's offset in its
// allocation, the GPU's UUID and the event's handle. Events come from a pool and go back to it
// only once their object is freed, so no consumer ever waits on a later record.
// Consumer, at get: the GPU UUID is mapped to a local device, handles are opened once and cached
// (LRU, TUTTI_RDT_IPC_CACHE mappings, default 256) as are event handles; the copy (or the views of
// a borrow) waits on the owner's event on the consumer's stream (GetOptions::stream). A get's
// copy is complete (its read-done event synchronised) before the agent ends its lease, so the
// owner's wait_tensor_freed orders the owner's reuse after the consumer's read.
//
// A CPU tensor at put, a CPU target at get, unified or host memory: kInvalidArgument before any
// I/O. A GPU this process cannot see: kUnavailable naming its UUID.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_ipc_mappings.h"
#include "cuda_ipc_places.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"
#include "tutti/transport_codec.h"

namespace tutti::cuda_ipc {
namespace {

// Driver entry points, found through the runtime (no link against libcuda).
using PointerGetAttribute = int (*)(void* data, int attribute, unsigned long long ptr);
constexpr int kBufferIdAttribute = 7;  // CU_POINTER_ATTRIBUTE_BUFFER_ID

constexpr size_t kEventPool = 1024;

// The events of this process's agents, by their IPC handle: a consumer in the owner's own
// process waits on the owner's event itself (CUDA opens no IPC handle where it was made).
std::mutex& local_events_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, cudaEvent_t>& local_events() {
  static auto* events = new std::map<std::string, cudaEvent_t>();
  return *events;
}
std::string handle_key(const cudaIpcEventHandle_t& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}
std::string as_string(const IpcHandleBytes& h) {
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}
static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes && kHandle == kIpcHandleBytes &&
                  sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes,
              "the ref's handles are CUDA's IPC handles");

// A tensor must lie within the owner's allocation as this process sees it (`size`, from the
// driver; 0: it did not say), whatever size the ref gave it.
void check_within(size_t index, uint64_t bytes, uint64_t offset, uint64_t size) {
  if (size == 0) return;
  if (bytes > size || offset > size - bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "cuda_ipc transport: tensor " + std::to_string(index) + " (" +
                    std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                    ") lies past the end of the owner's allocation as this process sees it (" +
                    std::to_string(size) + " bytes)");
  }
}

struct Exported {
  uint64_t buffer_id = 0;
  size_t size = 0;
  cudaIpcMemHandle_t handle{};
};

class CudaIpcTransport final : public TensorTransport {
 public:
  explicit CudaIpcTransport(const TransportContext& ctx) : agent_(ctx.agent.name) {}

  ~CudaIpcTransport() override {
    for (auto& [id, e] : live_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (auto& [device, s] : streams_) cudaStreamDestroy(s);
  }

  const char* name() const override { return "cuda_ipc"; }
  TransportTraits traits() const override {
    TransportTraits t;
    t.one_sided = true;
    t.can_borrow = true;
    t.cross_host = false;
    t.cuda = true;
    return t;
  }

  // ---- owner ----

  Publication publish(const PublishRequest& request) override {
    load_driver();
    Publication pub;
    WireWriter tensors;
    int device = -1;
    for (size_t i = 0; i < request.tensors.size(); ++i) {
      const TensorView& t = request.tensors[i];
      if (t.nbytes() == 0) {  // nothing to share
        const cudaIpcMemHandle_t none{};
        tensors.bytes(&none, kHandle).u64(0).u64(0).u64(0).u64(0);
        continue;
      }
      cudaPointerAttributes attr{};
      const cudaError_t e = cudaPointerGetAttributes(&attr, t.data());
      if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
        throw Error(ErrorCode::kInvalidArgument,
                    "cuda_ipc transport: tensor " + std::to_string(i) + " (" + t.str() +
                        ") is not device memory from cudaMalloc (host, managed or unknown memory "
                        "cannot be exported)");
      }
      if (device >= 0 && attr.device != device) {
        throw Error(ErrorCode::kInvalidArgument,
                    "cuda_ipc transport: the tensors of one object lie on devices " +
                        std::to_string(device) + " and " + std::to_string(attr.device));
      }
      device = attr.device;
      unsigned long long base = 0;
      size_t size = 0;
      uint64_t buffer_id = 0;
      const auto ptr = reinterpret_cast<unsigned long long>(t.data());
      if (get_range_(&base, &size, ptr) != 0 ||
          get_attribute_(&buffer_id, kBufferIdAttribute, ptr) != 0) {
        throw Error(ErrorCode::kInvalidArgument, "cuda_ipc transport: tensor " + std::to_string(i) +
                                                     " (" + t.str() +
                                                     "): the driver knows no "
                                                     "allocation at that address");
      }
      const cudaIpcMemHandle_t handle = export_allocation(base, size, buffer_id, device);
      tensors.bytes(&handle, kHandle).u64(ptr - base).u64(size).u64(buffer_id);
      tensors.u64(base);  // for a consumer in this process (CUDA opens no handle here)
    }
    // The object's order point: consumers' reads wait for the producer's work so far.
    cudaIpcEventHandle_t event_handle{};
    std::array<uint8_t, 16> uuid{};
    if (device >= 0) {
      DeviceScope scope(device);
      uuid = device_uuid(device);
      cudaEvent_t e = take_event(request.object.id);
      check(cudaEventRecord(e, static_cast<cudaStream_t>(request.stream)),
            "recording the object's event on the producer's stream");
      check(cudaIpcGetEventHandle(&event_handle, e), "exporting the object's event");
      std::lock_guard<std::mutex> lock(local_events_mutex());
      local_events()[handle_key(event_handle)] = e;
    }
    WireWriter blob;
    blob.bytes(uuid.data(), uuid.size()).bytes(&event_handle, sizeof(event_handle));
    pub.blob = std::move(blob.out()) + tensors.out();
    return pub;
  }

  void unpublish(ObjectId object) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_events_.find(object.id);
    if (it == live_events_.end()) return;
    {
      cudaIpcEventHandle_t h{};
      if (cudaIpcGetEventHandle(&h, it->second) == cudaSuccess) {
        std::lock_guard<std::mutex> events_lock(local_events_mutex());
        local_events().erase(handle_key(h));
      }
    }
    // Freed: no consumer reads the object any more, so the event may be recorded again.
    if (free_events_.size() < kEventPool) {
      free_events_.push_back(it->second);
    } else {
      cudaEventDestroy(it->second);
    }
    live_events_.erase(it);
  }

  // ---- consumer ----

  FetchResult fetch(const FetchRequest& request) override {
    const auto& metas = request.ref.tensors();
    const Places p = read_places(request.ref);
    const std::vector<Place>& places = p.places;
    FetchResult out;
    if (!p.any) {
      for (const TensorMeta& m : metas) out.views.emplace_back(nullptr, m.dtype, m.shape, m.device);
      return out;
    }
    const int device = local_device(p.uuid);
    DeviceScope scope(device);
    const std::string owner = hex(request.owner.owner().uuid.data(), 16);
    // Another agent of this process: the owner's addresses and events are valid here as they are.
    const bool same_process = request.owner.owner().pid == static_cast<uint32_t>(::getpid());
    cudaEvent_t ready = nullptr;
    if (same_process) {
      std::lock_guard<std::mutex> lock(local_events_mutex());
      auto it = local_events().find(as_string(p.event));
      if (it != local_events().end()) ready = it->second;
    } else {
      cudaIpcEventHandle_t event;
      std::memcpy(&event, p.event.data(), sizeof(event));
      ready = handles_.event(owner, event);
    }
    const GetAddressRange range = driver_range();
    cudaStream_t stream = static_cast<cudaStream_t>(request.stream);
    const bool own_stream = stream == nullptr;
    if (own_stream) stream = internal_stream(device);
    if (ready != nullptr) {
      check(cudaStreamWaitEvent(stream, ready, 0), "ordering the read after the producer");
    }
    std::vector<std::shared_ptr<Opened>> keep;
    std::vector<const char*> sources(metas.size(), nullptr);
    for (size_t i = 0; i < metas.size(); ++i) {
      if (metas[i].nbytes() == 0) continue;
      if (same_process) {
        check_within(i, metas[i].nbytes(), places[i].offset,
                     allocation_size(range, places[i].base));
        sources[i] = reinterpret_cast<const char*>(places[i].base) + places[i].offset;
        continue;
      }
      cudaIpcMemHandle_t handle;
      std::memcpy(&handle, places[i].handle.data(), sizeof(handle));
      auto o = handles_.memory(owner, handle, places[i].buffer_id, device, range);
      check_within(i, metas[i].nbytes(), places[i].offset, o->size);
      sources[i] = static_cast<const char*>(o->base) + places[i].offset;
      keep.push_back(std::move(o));
    }
    if (request.borrow) {
      for (size_t i = 0; i < metas.size(); ++i) {
        out.views.emplace_back(const_cast<char*>(sources[i]), metas[i].dtype, metas[i].shape,
                               Device::cuda(device));
      }
      // Views on the caller's stream are ordered by the wait above; without one, wait here.
      if (own_stream && ready != nullptr) {
        check(cudaEventSynchronize(ready), "waiting for the producer");
      }
      out.keep = std::make_shared<decltype(keep)>(std::move(keep));
      return out;
    }
    copy_out(request, sources, stream, own_stream);
    return out;
  }

 private:
  // Copies each tensor from `sources` into the request's targets on `stream` and waits until
  // the read is done (before the lease ends: the owner may then reuse the memory).
  static void copy_out(const FetchRequest& request, const std::vector<const char*>& sources,
                       cudaStream_t stream, bool own_stream) {
    const auto& metas = request.ref.tensors();
    cudaEvent_t done = nullptr;
    check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creating a read-done event");
    if (own_stream) {
      // Without a stream of the caller's, its work on the targets is on the device's legacy
      // default stream (as for the NCCL backend's ops): the copy waits for it, else a write the
      // caller queued there before the get could land after the copy.
      cudaError_t e = cudaEventRecord(done, nullptr);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, done, 0);
      if (e != cudaSuccess) cudaEventDestroy(done);
      check(e, "ordering the copy after the caller's default stream");
    }
    for (size_t i = 0; i < metas.size(); ++i) {
      if (metas[i].nbytes() == 0) continue;
      const cudaError_t copied =
          cudaMemcpyAsync(request.targets[i].data(), sources[i], metas[i].nbytes(),
                          cudaMemcpyDeviceToDevice, stream);
      if (copied != cudaSuccess) cudaEventDestroy(done);
      check(copied, "copying tensor " + std::to_string(i));
    }
    cudaError_t e = cudaEventRecord(done, stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(done);
    cudaEventDestroy(done);
    check(e, "waiting for the copy");
  }

  // The driver's cuMemGetAddressRange for a consumer's checks of the ref against the memory;
  // null where the runtime cannot give it (before CUDA 12.5: cudaGetDriverEntryPointByVersion),
  // which leaves the checks against the ref's own sizes.
  GetAddressRange driver_range() { return find_driver() ? get_range_ : nullptr; }

  // The driver's entry points, looked up until found; false where the runtime cannot give them.
  bool find_driver() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (get_range_ != nullptr) return true;
    void* range = nullptr;
    void* attribute = nullptr;
    cudaDriverEntryPointQueryResult q1{}, q2{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &range, 12000, cudaEnableDefault,
                                         &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &attribute, 12000,
                                         cudaEnableDefault, &q2) != cudaSuccess ||
        range == nullptr || attribute == nullptr) {
      return false;
    }
    get_range_ = reinterpret_cast<GetAddressRange>(range);
    get_attribute_ = reinterpret_cast<PointerGetAttribute>(attribute);
    return true;
  }

  // The owner's side needs them (an allocation's range and buffer id to export it).
  void load_driver() {
    if (!find_driver()) {
      throw Error(ErrorCode::kUnavailable,
                  "cuda_ipc transport: the CUDA driver's cuMemGetAddressRange / "
                  "cuPointerGetAttribute are not available");
    }
  }

  cudaIpcMemHandle_t export_allocation(unsigned long long base, size_t size, uint64_t buffer_id,
                                       int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = exported_.find(base);
    if (it != exported_.end() && it->second.buffer_id == buffer_id && it->second.size == size) {
      return it->second.handle;
    }
    Exported x;
    x.buffer_id = buffer_id;
    x.size = size;
    DeviceScope scope(device);
    const cudaError_t e = cudaIpcGetMemHandle(&x.handle, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      cuda_fail(ErrorCode::kInvalidArgument,
                "exporting the allocation at 0x" + hex(reinterpret_cast<const uint8_t*>(&base), 8) +
                    " (memory from a pool or cuMemCreate cannot be exported with cudaIpc)",
                e);
    }
    exported_[base] = x;  // a recycled address has another buffer id: exported again
    return x.handle;
  }

  cudaEvent_t take_event(uint64_t object) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t e = nullptr;
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    } else {
      check(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming),
            "creating an interprocess event");
    }
    live_events_[object] = e;
    return e;
  }

  std::array<uint8_t, 16> device_uuid(int device) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, device), "reading device " + std::to_string(device));
    std::array<uint8_t, 16> out{};
    std::memcpy(out.data(), p.uuid.bytes, 16);
    return out;
  }

  int local_device(const std::array<uint8_t, 16>& uuid) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    for (int d = 0; d < n; ++d) {
      if (device_uuid(d) == uuid) return d;
    }
    throw Error(ErrorCode::kUnavailable,
                "cuda_ipc transport: the owner's GPU (uuid " + hex(uuid.data(), 16) +
                    ") is not one of "
                    "the " +
                    std::to_string(n) + " this process sees (CUDA_VISIBLE_DEVICES)");
  }

  cudaStream_t internal_stream(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
    streams_[device] = s;
    return s;
  }

  const std::string agent_;
  std::mutex mutex_;
  GetAddressRange get_range_ = nullptr;
  PointerGetAttribute get_attribute_ = nullptr;
  std::map<unsigned long long, Exported> exported_;  // by allocation base
  std::map<uint64_t, cudaEvent_t> live_events_;      // by object id
  std::vector<cudaEvent_t> free_events_;
  std::map<int, cudaStream_t> streams_;
  OpenedHandles handles_;  // the consumer's mappings of owners' memory and events
};

}  // namespace

// Registered when libtutti_cuda_ipc is loaded; available where a GPU is visible.
struct RegisterCudaIpc {
  RegisterCudaIpc() {
    TransportInfo info;
    info.name = "cuda_ipc";
    info.factory = [](const TransportContext& ctx) {
      return std::make_unique<CudaIpcTransport>(ctx);
    };
    info.available = [] {
      int n = 0;
      return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    };
    info.devices = {DeviceType::kCUDA};
    info.priority = 20;  // "auto" for CUDA tensors
    register_tensor_transport(std::move(info));
  }
};

const RegisterCudaIpc kRegisterCudaIpc;

}  // namespace tutti::cuda_ipc
