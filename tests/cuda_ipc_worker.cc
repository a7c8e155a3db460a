// The owner's side of tests/cuda_ipc_test.cc, in its own process (CUDA opens no IPC handle in the
// process that made it):
//   cuda_ipc_worker owner <dir>   publish three CUDA tensors (two in one allocation) on
//                                 cuda_ipc, write <dir>/ref, wait for <dir>/done
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tutti/transfer_agent.h"

using namespace tutti;

namespace {

bool wait_file(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

int owner(const std::string& dir) {
  TransferAgentOptions o;
  o.name = "cuda-owner";
  auto agent = TransferAgent::create(o);
  const size_t a_bytes = 1 << 20, b_bytes = 64 << 10;
  std::vector<uint8_t> a(a_bytes), b(b_bytes);
  for (size_t i = 0; i < a_bytes; ++i) a[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t i = 0; i < b_bytes; ++i) b[i] = static_cast<uint8_t>(i * 11 + 1);
  void* da = nullptr;
  void* db = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMalloc(&da, a_bytes) != cudaSuccess || cudaMalloc(&db, b_bytes) != cudaSuccess ||
      cudaStreamCreate(&stream) != cudaSuccess) {
    std::fprintf(stderr, "cuda_ipc_worker: no device memory\n");
    return 3;
  }
  // The producer's writes are queued on its stream; the put orders consumers after them.
  cudaMemcpyAsync(da, a.data(), a_bytes, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(db, b.data(), b_bytes, cudaMemcpyHostToDevice, stream);
  TensorView whole(da, DType::kUInt8, {static_cast<int64_t>(a_bytes)}, Device::cuda(0));
  PutOptions p;
  p.transport = "cuda_ipc";
  p.stream = stream;
  ObjectHandle h =
      agent->put({whole.slice(0, 256 << 10), whole.slice(512 << 10, 256 << 10),
                  TensorView(db, DType::kUInt8, {static_cast<int64_t>(b_bytes)}, Device::cuda(0))},
                 p);
  {
    std::ofstream(dir + "/ref.tmp") << h.ref().to_text();
    std::rename((dir + "/ref.tmp").c_str(), (dir + "/ref").c_str());
  }
  const bool done = wait_file(dir + "/done", std::chrono::seconds(120));
  h.release();
  agent->wait_tensor_freed(whole, std::chrono::seconds(30));
  cudaFree(da);
  cudaFree(db);
  cudaStreamDestroy(stream);
  return done ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "owner") {
    std::fprintf(stderr, "usage: cuda_ipc_worker owner <dir>\n");
    return 2;
  }
  try {
    return owner(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ipc_worker: %s\n", e.what());
    return 1;
  }
}
