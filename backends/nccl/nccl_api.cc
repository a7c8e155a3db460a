#include "nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "tutti/error.h"

namespace tutti::nccl_backend {
namespace {

NcclApi load() {
  NcclApi api;
  const char* env = std::getenv("TUTTI_NCCL_LIBRARY");
  api.library = (env != nullptr && *env != '\0') ? env : "libnccl.so.2";
  void* handle = ::dlopen(api.library.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw Error(ErrorCode::kUnavailable,
                "nccl: cannot load " + api.library + " (" + (why ? why : "unknown") +
                    "); install NCCL (e.g. the nvidia-nccl-cu13 Python package) and put its "
                    "lib/ on LD_LIBRARY_PATH, or set TUTTI_NCCL_LIBRARY to the library's path");
  }
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    if (fn == nullptr) {
      throw Error(ErrorCode::kUnavailable, "nccl: " + api.library + " lacks " + name + " (NCCL " +
                                               std::to_string(api.version) + "; tutti needs " +
                                               std::to_string(kMinNcclVersion) + " or newer)");
    }
  };
  resolve(api.GetVersion, "ncclGetVersion");
  if (api.GetVersion(&api.version) != ncclSuccess || api.version < kMinNcclVersion) {
    throw Error(ErrorCode::kUnavailable, "nccl: " + api.library + " is NCCL version " +
                                             std::to_string(api.version) + "; tutti needs " +
                                             std::to_string(kMinNcclVersion) +
                                             " or newer (non-blocking communicators)");
  }
  resolve(api.GetUniqueId, "ncclGetUniqueId");
  resolve(api.CommInitRankConfig, "ncclCommInitRankConfig");
  resolve(api.CommGetAsyncError, "ncclCommGetAsyncError");
  resolve(api.CommFinalize, "ncclCommFinalize");
  resolve(api.CommDestroy, "ncclCommDestroy");
  resolve(api.CommAbort, "ncclCommAbort");
  // Both or neither: a revoked communicator is kept for ncclCommShrink, and without shrink there
  // is no reason to keep it.
  auto revoke = reinterpret_cast<decltype(api.CommRevoke)>(::dlsym(handle, "ncclCommRevoke"));
  auto shrink = reinterpret_cast<decltype(api.CommShrink)>(::dlsym(handle, "ncclCommShrink"));
  const char* off = std::getenv("TUTTI_NCCL_SHRINK");
  if (revoke != nullptr && shrink != nullptr && !(off != nullptr && std::string(off) == "0")) {
    api.CommRevoke = revoke;
    api.CommShrink = shrink;
  }
  resolve(api.GetErrorString, "ncclGetErrorString");
  resolve(api.GetLastError, "ncclGetLastError");
  resolve(api.GroupStart, "ncclGroupStart");
  resolve(api.GroupEnd, "ncclGroupEnd");
  resolve(api.AllReduce, "ncclAllReduce");
  resolve(api.Broadcast, "ncclBroadcast");
  resolve(api.Reduce, "ncclReduce");
  resolve(api.AllGather, "ncclAllGather");
  resolve(api.ReduceScatter, "ncclReduceScatter");
  resolve(api.Send, "ncclSend");
  resolve(api.Recv, "ncclRecv");
  return api;
}

}  // namespace

const NcclApi& nccl_api() {
  // A failed load is retried by the next call (the library may be installed meanwhile); a
  // successful one is kept for the life of the process.
  static std::mutex mutex;
  static NcclApi* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded == nullptr) loaded = new NcclApi(load());
  return *loaded;
}

bool nccl_available() noexcept {
  try {
    nccl_api();
    int devices = 0;
    return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  } catch (...) {
    return false;
  }
}

}  // namespace tutti::nccl_backend
