// The CUDA runtime, loaded at run time, for builds made against tutti's declared CUDA headers
// (TUTTI_CUDA_HEADERS=DECLARED; backends/cuda/declared/). Each entry point of
// declared/cuda_runtime_api.h is defined here, hidden inside whichever tutti library or program
// links this, and forwards to the same function of the runtime found at run time:
// TUTTI_CUDART_LIBRARY if set, else libcudart.so.13, else libcudart.so.12 (an already loaded one,
// e.g. torch's, is found by its name). Where none loads, every call fails:
// cudaGetDeviceCount with cudaErrorNoDevice (no device, as on a machine without a GPU), the
// others with cudaErrorSharedObjectInitFailed, and cudaGetErrorString says what did not load.
// A function the loaded runtime lacks fails with cudaErrorNotSupported.
#pragma GCC visibility push(hidden)
#include "cuda_runtime_api.h"
#pragma GCC visibility pop

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace {

struct Runtime {
  void* handle = nullptr;
  std::string why;  // when handle is null: what was tried and the loader's words
};

const Runtime& runtime() {
  static const Runtime r = [] {
    Runtime out;
    const char* env = std::getenv("TUTTI_CUDART_LIBRARY");
    const char* names[] = {"libcudart.so.13", "libcudart.so.12"};
    if (env != nullptr && *env != '\0') {
      out.handle = ::dlopen(env, RTLD_NOW | RTLD_GLOBAL);
      if (out.handle == nullptr) {
        const char* e = ::dlerror();
        out.why = std::string("TUTTI_CUDART_LIBRARY=") + env + ": " + (e ? e : "did not load");
      }
      return out;
    }
    for (const char* name : names) {
      out.handle = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (out.handle != nullptr) return out;
      const char* e = ::dlerror();
      if (!out.why.empty()) out.why += "; ";
      out.why += e ? e : name;
    }
    out.why = "the CUDA runtime could not be loaded (" + out.why +
              "; set TUTTI_CUDART_LIBRARY to its path)";
    return out;
  }();
  return r;
}

void* resolve(const char* name) {
  const Runtime& r = runtime();
  return r.handle == nullptr ? nullptr : ::dlsym(r.handle, name);
}

cudaError_t unavailable() {
  return runtime().handle == nullptr ? cudaErrorSharedObjectInitFailed : cudaErrorNotSupported;
}

}  // namespace

// Each forwarder resolves its function once (a thread-safe static) and calls it.
#define TUTTI_FORWARD(name, params, args)                                       \
  cudaError_t name params {                                                     \
    static auto* const f = reinterpret_cast<decltype(&::name)>(resolve(#name)); \
    return f != nullptr ? f args : unavailable();                               \
  }

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  static auto* const f =
      reinterpret_cast<decltype(&::cudaGetDeviceCount)>(resolve("cudaGetDeviceCount"));
  if (f == nullptr) {
    if (count != nullptr) *count = 0;
    return cudaErrorNoDevice;
  }
  return f(count);
}

const char* cudaGetErrorString(cudaError_t error) {
  static auto* const f =
      reinterpret_cast<decltype(&::cudaGetErrorString)>(resolve("cudaGetErrorString"));
  if (f != nullptr) return f(error);
  return runtime().handle == nullptr ? runtime().why.c_str()
                                     : "the loaded CUDA runtime has no cudaGetErrorString";
}

const char* cudaGetErrorName(cudaError_t error) {
  static auto* const f =
      reinterpret_cast<decltype(&::cudaGetErrorName)>(resolve("cudaGetErrorName"));
  return f != nullptr ? f(error) : "cudaErrorSharedObjectInitFailed";
}

TUTTI_FORWARD(cudaGetDevice, (int* device), (device))
TUTTI_FORWARD(cudaSetDevice, (int device), (device))
TUTTI_FORWARD(cudaGetDeviceProperties, (struct cudaDeviceProp * prop, int device), (prop, device))
TUTTI_FORWARD(cudaDeviceGetPCIBusId, (char* bus, int len, int device), (bus, len, device))
TUTTI_FORWARD(cudaDeviceSynchronize, (void), ())
TUTTI_FORWARD(cudaRuntimeGetVersion, (int* v), (v))
TUTTI_FORWARD(cudaDriverGetVersion, (int* v), (v))
TUTTI_FORWARD(cudaGetDriverEntryPointByVersion,
              (const char* symbol, void** fn, unsigned int version, unsigned long long flags,
               cudaDriverEntryPointQueryResult* status),
              (symbol, fn, version, flags, status))
TUTTI_FORWARD(cudaGetLastError, (void), ())
TUTTI_FORWARD(cudaMalloc, (void** p, size_t n), (p, n))
TUTTI_FORWARD(cudaFree, (void* p), (p))
TUTTI_FORWARD(cudaMallocHost, (void** p, size_t n), (p, n))
TUTTI_FORWARD(cudaFreeHost, (void* p), (p))
TUTTI_FORWARD(cudaMallocAsync, (void** p, size_t n, cudaStream_t s), (p, n, s))
TUTTI_FORWARD(cudaFreeAsync, (void* p, cudaStream_t s), (p, s))
TUTTI_FORWARD(cudaPointerGetAttributes, (struct cudaPointerAttributes * a, const void* p), (a, p))
TUTTI_FORWARD(cudaMemcpy, (void* d, const void* s, size_t n, enum cudaMemcpyKind k), (d, s, n, k))
TUTTI_FORWARD(cudaMemcpyAsync,
              (void* d, const void* s, size_t n, enum cudaMemcpyKind k, cudaStream_t st),
              (d, s, n, k, st))
TUTTI_FORWARD(cudaMemset, (void* p, int v, size_t n), (p, v, n))
TUTTI_FORWARD(cudaMemsetAsync, (void* p, int v, size_t n, cudaStream_t s), (p, v, n, s))
TUTTI_FORWARD(cudaStreamCreate, (cudaStream_t * s), (s))
TUTTI_FORWARD(cudaStreamCreateWithFlags, (cudaStream_t * s, unsigned int flags), (s, flags))
TUTTI_FORWARD(cudaStreamDestroy, (cudaStream_t s), (s))
TUTTI_FORWARD(cudaStreamSynchronize, (cudaStream_t s), (s))
TUTTI_FORWARD(cudaStreamQuery, (cudaStream_t s), (s))
TUTTI_FORWARD(cudaStreamGetDevice, (cudaStream_t s, int* device), (s, device))
TUTTI_FORWARD(cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned int flags),
              (s, e, flags))
TUTTI_FORWARD(cudaLaunchHostFunc, (cudaStream_t s, cudaHostFn_t fn, void* data), (s, fn, data))
TUTTI_FORWARD(cudaEventCreate, (cudaEvent_t * e), (e))
TUTTI_FORWARD(cudaEventCreateWithFlags, (cudaEvent_t * e, unsigned int flags), (e, flags))
TUTTI_FORWARD(cudaEventDestroy, (cudaEvent_t e), (e))
TUTTI_FORWARD(cudaEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))
TUTTI_FORWARD(cudaEventQuery, (cudaEvent_t e), (e))
TUTTI_FORWARD(cudaEventSynchronize, (cudaEvent_t e), (e))
TUTTI_FORWARD(cudaEventElapsedTime, (float* ms, cudaEvent_t a, cudaEvent_t b), (ms, a, b))
TUTTI_FORWARD(cudaIpcGetMemHandle, (cudaIpcMemHandle_t * h, void* p), (h, p))
TUTTI_FORWARD(cudaIpcOpenMemHandle, (void** p, cudaIpcMemHandle_t h, unsigned int flags),
              (p, h, flags))
TUTTI_FORWARD(cudaIpcCloseMemHandle, (void* p), (p))
TUTTI_FORWARD(cudaIpcGetEventHandle, (cudaIpcEventHandle_t * h, cudaEvent_t e), (h, e))
TUTTI_FORWARD(cudaIpcOpenEventHandle, (cudaEvent_t * e, cudaIpcEventHandle_t h), (e, h))

}  // extern "C"
