// Helpers for the NCCL backend's multi-process tests: device buffers, skipping without enough
// GPUs, ranks as child processes of the test binary, and the stand-in's leak counters.
//
// The same binaries run against the real CUDA runtime and NCCL (label "gpu") and against the
// stand-in (label "standin", tests/standin/): checks that only the stand-in can make (its
// counters, its injected errors) skip elsewhere.
#pragma once

#include <cuda_runtime_api.h>
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "reference.h"
#include "standin/standin.h"
#include "test_util.h"

namespace tutti::testing {

// Why NCCL tests that need `devices` GPUs cannot run here, or "" when they can.
inline std::string why_not_enough_gpus(int devices) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (!is_backend_available("nccl")) {
    return "NCCL does not load (put libnccl.so.2 on LD_LIBRARY_PATH or set TUTTI_NCCL_LIBRARY)";
  }
  if (n < devices) {
    return "needs " + std::to_string(devices) + " GPUs, " + std::to_string(n) + " visible";
  }
  return "";
}

#define SKIP_WITHOUT_GPUS(n)                         \
  do {                                               \
    const std::string why_ = why_not_enough_gpus(n); \
    if (!why_.empty()) GTEST_SKIP() << why_;         \
  } while (0)

#define SKIP_WITHOUT_STANDIN()                                                                   \
  do {                                                                                           \
    if (!::tutti::standin::active()) GTEST_SKIP() << "needs the stand-in CUDA runtime and NCCL"; \
  } while (0)

// Device memory on one device, freed at scope end. Copies run on that device's legacy default
// stream, so they are ordered after the ops a group enqueued there without an explicit stream.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    cudaSetDevice(device_);
    if (cudaMalloc(&ptr_, bytes_) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  int device() const { return device_; }
  // n elements of dtype starting at element `first`.
  TensorView view(DType dtype, int64_t n, int64_t first = 0) const {
    return TensorView(static_cast<char*>(ptr_) + first * dtype_size(dtype), dtype, {n},
                      Device::cuda(device_));
  }
  // Writes value(i) to elements [first, first + n).
  void fill(DType dtype, int64_t n, const std::function<double(int64_t)>& value,
            int64_t first = 0) const {
    std::vector<uint64_t> host((n * dtype_size(dtype)) / 8 + 1);
    for (int64_t i = 0; i < n; ++i) write_value(dtype, host.data(), i, value(i));
    cudaSetDevice(device_);
    cudaMemcpy(static_cast<char*>(ptr_) + first * dtype_size(dtype), host.data(),
               n * dtype_size(dtype), cudaMemcpyHostToDevice);
  }
  // Elements [first, first + n) as doubles.
  std::vector<double> read(DType dtype, int64_t n, int64_t first = 0) const {
    std::vector<uint64_t> host((n * dtype_size(dtype)) / 8 + 1);
    cudaSetDevice(device_);
    cudaMemcpy(host.data(), static_cast<char*>(ptr_) + first * dtype_size(dtype),
               n * dtype_size(dtype), cudaMemcpyDeviceToHost);
    std::vector<double> out(n);
    for (int64_t i = 0; i < n; ++i) out[i] = read_value(dtype, host.data(), i);
    return out;
  }

 private:
  int device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// Expects got[i] == expected(i) rounded to dtype; reports the first mismatch only.
inline void expect_values(DType dtype, const std::vector<double>& got,
                          const std::function<double(int64_t)>& expected, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = as_dtype(dtype, expected(static_cast<int64_t>(i)));
    if (got[i] != want) {
      ADD_FAILURE() << what << " (" << to_string(dtype) << "): element " << i << " is " << got[i]
                    << ", expected " << want;
      return;
    }
  }
}

// Runs this test binary once per entry of `envs` as `--gtest_filter=<child_test>`; each child
// reads its part from the environment. Returns when all have exited (at most `limit`).
inline std::vector<WorkerResult> run_children(const std::string& child_test,
                                              const std::vector<std::vector<std::string>>& envs,
                                              std::chrono::milliseconds limit) {
  return run_processes({"/proc/self/exe", "--gtest_filter=" + child_test}, envs, limit);
}

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

inline std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The stand-in's shared-memory segments whose names carry `tag` (TUTTI_STANDIN_TAG).
inline std::vector<std::string> standin_segments(const std::string& tag) {
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    const std::string prefix = "tutti-standin-" + tag + "-";
    while (dirent* e = ::readdir(dir)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    }
    ::closedir(dir);
  }
  return found;
}

// Under the stand-in: nothing of the CUDA runtime or NCCL is left alive in this process, and
// nothing was misused (a destroyed handle, two threads in one communicator).
inline void expect_standin_clean(const std::string& when) {
  if (!standin::active()) return;
  EXPECT_EQ(standin::count("tutti_standin_cuda_live_streams"), 0) << when;
  EXPECT_EQ(standin::count("tutti_standin_cuda_live_events"), 0) << when;
  EXPECT_EQ(standin::count("tutti_standin_cuda_bad_handles"), 0) << when;
  // -1: NCCL was never loaded in this process.
  EXPECT_LE(standin::count("tutti_standin_nccl_live_comms"), 0) << when;
  EXPECT_LE(standin::count("tutti_standin_nccl_concurrent_calls"), 0)
      << when << ": two threads were inside one NCCL communicator";
}

}  // namespace tutti::testing
