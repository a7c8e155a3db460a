// One process driving every GPU it sees (Ray's *_multigpu API): a world of one process whose
// collective spans all local GPUs.
//
//   ./multigpu_allreduce
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include <tutti/tutti.h>

int main() {
  try {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
      std::fprintf(stderr, "no GPU visible\n");
      return 1;
    }
    tutti::init_collective_group(1, 0, "nccl", "multi");
    const size_t n = 1 << 20;
    std::vector<float*> buffers(gpus);
    std::vector<tutti::TensorView> list;
    for (int d = 0; d < gpus; ++d) {
      cudaSetDevice(d);
      std::vector<float> host(n, static_cast<float>(d + 1));
      cudaMalloc(reinterpret_cast<void**>(&buffers[d]), n * sizeof(float));
      cudaMemcpy(buffers[d], host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
      list.emplace_back(buffers[d], tutti::DType::kFloat32,
                        std::vector<int64_t>{static_cast<int64_t>(n)}, tutti::Device::cuda(d));
    }
    tutti::allreduce_multigpu(list, "multi");  // sum over every GPU of every process
    for (int d = 0; d < gpus; ++d) {
      tutti::synchronize(tutti::Device::cuda(d), "multi");
      float first = 0;
      cudaSetDevice(d);
      cudaMemcpy(&first, buffers[d], sizeof(float), cudaMemcpyDeviceToHost);
      std::printf("cuda:%d: sum %g (expected %g)\n", d, first, gpus * (gpus + 1) / 2.0);
      cudaFree(buffers[d]);
    }
    tutti::destroy_collective_group("multi");
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
