// An allreduce over GPUs, one process per GPU. Start it with tutti-run (one rank per GPU):
//
//   tutti-run -n 4 --backend nccl ./gpu_allreduce
//
// Each rank uses GPU local_rank(), fills a float buffer with rank+1 and prints the sum.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    const int device = tutti::local_rank() >= 0 ? tutti::local_rank() : 0;
    cudaSetDevice(device);
    tutti::init_collective_group_from_env("nccl", "default");
    const int rank = tutti::get_rank(), world = tutti::get_collective_group_size();

    const size_t n = 1 << 20;
    std::vector<float> host(n, static_cast<float>(rank + 1));
    float* data = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(float));
    cudaMemcpy(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);

    // Enqueued on the device's default stream after the copy above; returns at once.
    tutti::allreduce(tutti::TensorView(data, tutti::DType::kFloat32, {static_cast<int64_t>(n)},
                                       tutti::Device::cuda(device)));
    cudaMemcpy(host.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost);  // waits for it
    std::printf("rank %d/%d on cuda:%d: sum %g (expected %g)\n", rank, world, device, host[0],
                world * (world + 1) / 2.0);
    cudaFree(data);
    tutti::destroy_collective_group();
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
