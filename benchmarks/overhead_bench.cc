// tutti's own cost per call, with no communication: a group of one, where every backend
// returns at once. What is left is validation, sequencing and dispatch.
//
//   build/bin/tutti-overhead-bench
#include <benchmark/benchmark.h>

#include <vector>

#include "tutti/tutti.h"

namespace {

void BM_Allreduce8B(benchmark::State& state, const char* backend) {
  auto group = tutti::CollectiveGroup::create(1, 0, backend, "overhead");
  std::vector<float> v(2, 1.0f);
  tutti::TensorView t(v);
  for (auto _ : state) {
    group->allreduce(t);
    benchmark::ClobberMemory();
  }
}
BENCHMARK_CAPTURE(BM_Allreduce8B, gloo, "gloo");
BENCHMARK_CAPTURE(BM_Allreduce8B, shm, "shm");

void BM_TensorViewFromVector(benchmark::State& state) {
  std::vector<float> v(2, 1.0f);
  for (auto _ : state) {
    tutti::TensorView t(v);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_TensorViewFromVector);

void BM_Barrier(benchmark::State& state) {
  auto group = tutti::CollectiveGroup::create(1, 0, "shm", "overhead-barrier");
  for (auto _ : state) group->barrier();
}
BENCHMARK(BM_Barrier);

}  // namespace

BENCHMARK_MAIN();
