// The two-sided "nccl" tensor transport: agents in one process, one per rank of the transport's
// NCCL group, each on a GPU of its own (the stand-in's devices under label "standin"; real GPUs
// under label "gpu", skipping without three). The owner sends from its device memory and the
// consumer receives into its own, over the two-rank communicator of their pair (a local split of
// the transport's group), values checked against patterns computed here.
#include <cuda_runtime_api.h>

#include <memory>

#include "nccl_test_util.h"
#include "tutti/hash_store.h"
#include "tutti/transfer_agent.h"

namespace tutti::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kAgents = 3;
constexpr int64_t kCount = 50000;  // floats: 200 KB

double value(int agent, int64_t i) {
  return agent * 100000.0 + static_cast<double>(i);
}

std::vector<std::shared_ptr<TransferAgent>> nccl_agents() {
  std::vector<std::shared_ptr<TransferAgent>> agents;
  for (int r = 0; r < kAgents; ++r) {
    TransferAgentOptions o;
    o.name = "nccl-" + std::to_string(r);
    agents.push_back(TransferAgent::create(o));
  }
  GroupOptions go;
  go.store = std::make_shared<HashStore>();
  go.timeout = 60s;
  run_ranks(kAgents, [&](int r) {
    cudaSetDevice(r);
    agents[r]->join_group("nccl", kAgents, r, go);
  });
  return agents;
}

// Three agents in a ring, each getting its neighbour's object into its own device memory, all at
// once and several times over (each pair's transfers run on their own communicator and thread:
// no pair waits on another); then the other way round.
TEST(TransferNccl, ARingOfAgentsGetsEachOthersDeviceTensors) {
  SKIP_WITHOUT_GPUS(kAgents);
  {
    auto agents = nccl_agents();
    std::vector<std::unique_ptr<DeviceBuffer>> sources;
    std::vector<ObjectHandle> handles;
    PutOptions p;
    p.transport = "nccl";
    for (int r = 0; r < kAgents; ++r) {
      sources.push_back(std::make_unique<DeviceBuffer>(r, kCount * 4));
      sources.back()->fill(DType::kFloat32, kCount, [r](int64_t i) { return value(r, i); });
      handles.push_back(agents[r]->put({sources.back()->view(DType::kFloat32, kCount)}, p));
      EXPECT_TRUE(handles.back().ref().is_two_sided());
    }
    for (int step : {1, kAgents - 1}) {
      run_ranks(kAgents, [&](int r) {
        cudaSetDevice(r);
        const int from = (r + step) % kAgents;
        DeviceBuffer into(r, kCount * 4);
        for (int round = 0; round < 5; ++round) {
          into.fill(DType::kFloat32, kCount, [](int64_t) { return -1.0; });
          GetOptions g;
          g.targets = {into.view(DType::kFloat32, kCount)};
          g.timeout = 30s;
          agents[r]->get(handles[from].ref(), g);
          expect_values(
              DType::kFloat32, into.read(DType::kFloat32, kCount),
              [from](int64_t i) { return value(from, i); },
              "agent " + std::to_string(r) + " from " + std::to_string(from));
        }
      });
    }
    // Before any I/O: a CPU target, and no target at all (the transport receives into CUDA
    // memory only).
    std::vector<float> host(kCount);
    GetOptions cpu;
    cpu.targets = {TensorView(host)};
    EXPECT_TUTTI_ERROR(agents[1]->get(handles[0].ref(), cpu), ErrorCode::kInvalidArgument, "CUDA");
    EXPECT_TUTTI_ERROR(agents[1]->get(handles[0].ref()), ErrorCode::kInvalidArgument,
                       "give targets");
    handles.clear();
    agents.clear();
  }
  expect_standin_clean("after the agents went");
}

}  // namespace
}  // namespace tutti::testing
