// The NCCL backend at world sizes 1, 2 and 4, each rank a process driving 1 to 4 GPUs: every
// collective with every dtype and reduce op (values checked against reference.h, computed
// independently), the single-tensor and the multi-GPU list forms, contiguous and separate
// output and input lists, point-to-point between every rank's devices, an op ordered after a
// delayed caller stream, synchronize covering an op on an explicit stream, a message larger
// than any internal chunk, and barrier. Rank r drives
// GPUs r x devices ... r x devices + devices - 1.
//
// Runs on real GPUs (label "gpu", skipping without world x devices of them) and on the stand-in
// (label "standin"), where it also checks that nothing of the CUDA runtime or NCCL is leaked.
#include <unistd.h>

#include <memory>
#include <thread>

#include "nccl_test_util.h"

namespace tutti::testing {
namespace {

const DType kDTypes[] = {DType::kBool,    DType::kInt8,     DType::kUInt8,   DType::kInt32,
                         DType::kUInt32,  DType::kInt64,    DType::kUInt64,  DType::kFloat16,
                         DType::kBFloat16, DType::kFloat32, DType::kFloat64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kAvg};

// One rank of the job: its group, its devices, and one check per op.
class Rank {
 public:
  Rank(std::shared_ptr<CollectiveGroup> g, int rank, int world, int devices)
      : g_(std::move(g)), rank_(rank), world_(world), k_(devices) {}

  void run() {
    int index = 0;
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(to_string(dtype));
      const bool contiguous = index % 2 == 0;
      const int root = index % world_;
      const int root_tensor = index % k_;
      ++index;
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
        SCOPED_TRACE(to_string(op));
        allreduce(dtype, op, kCount);
        reduce(dtype, op, root, root_tensor);
        reduce_scatter(dtype, op, contiguous);
      }
      broadcast(dtype, root, root_tensor);
      allgather(dtype, contiguous);
    }
    // Larger than any chunk an implementation moves at once (the stand-in's channels: 64 KiB).
    allreduce(DType::kFloat32, ReduceOp::kSum, 100003);
    if (world_ > 1) send_recv();
    if (k_ == 1) {
      ordered_after_a_delayed_stream();
      synchronize_waits_for_an_explicit_stream();
    }
    // Barrier follows the devices of the last collective, whatever GPU is current: here rank
    // 0's current GPU is another rank's, the other ranks' their own.
    if (rank_ == 0) cudaSetDevice(k_ % nranks());
    g_->barrier();
  }

 private:
  static constexpr int64_t kCount = 37;

  int global(int d) const { return rank_ * k_ + d; }  // the NCCL rank of local device d
  int nranks() const { return world_ * k_; }
  std::string where(const char* op, int d) const {
    return std::string(op) + " on rank " + std::to_string(rank_) + " device " + std::to_string(d);
  }

  std::vector<std::unique_ptr<DeviceBuffer>> buffers(DType dtype, int64_t n) const {
    std::vector<std::unique_ptr<DeviceBuffer>> out;
    for (int d = 0; d < k_; ++d) {
      out.push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
    }
    return out;
  }
  static std::vector<TensorView> views(const std::vector<std::unique_ptr<DeviceBuffer>>& b,
                                       DType dtype, int64_t n) {
    std::vector<TensorView> out;
    for (const auto& x : b) out.push_back(x->view(dtype, n));
    return out;
  }

  void allreduce(DType dtype, ReduceOp op, int64_t n) {
    auto b = buffers(dtype, n);
    for (int d = 0; d < k_; ++d) {
      b[d]->fill(dtype, n, [&](int64_t i) { return input_value(op, dtype, global(d), nranks(), i); });
    }
    AllreduceOptions o;
    o.reduce_op = op;
    if (k_ == 1) {
      g_->allreduce(b[0]->view(dtype, n), o);
    } else {
      g_->allreduce_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(dtype, b[d]->read(dtype, n),
                    [&](int64_t i) { return expected_reduction(op, dtype, nranks(), i); },
                    where("allreduce", d));
    }
  }

  void reduce(DType dtype, ReduceOp op, int root, int root_tensor) {
    const int64_t n = kCount;
    auto b = buffers(dtype, n);
    auto input = [&](int d) {
      return [=](int64_t i) { return input_value(op, dtype, global(d), nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) b[d]->fill(dtype, n, input(d));
    ReduceOptions o;
    o.reduce_op = op;
    o.root_rank = root;
    o.root_tensor = root_tensor;
    if (k_ == 1) {
      g_->reduce(b[0]->view(dtype, n), o);
    } else {
      g_->reduce_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      if (rank_ == root && d == root_tensor) {
        expect_values(dtype, b[d]->read(dtype, n),
                      [&](int64_t i) { return expected_reduction(op, dtype, nranks(), i); },
                      where("reduce (root)", d));
      } else {
        expect_values(dtype, b[d]->read(dtype, n), input(d), where("reduce (not root)", d));
      }
    }
  }

  void broadcast(DType dtype, int root, int root_tensor) {
    const int64_t n = kCount;
    auto b = buffers(dtype, n);
    auto value = [&](int g) {
      return [=](int64_t i) { return input_value(ReduceOp::kMax, dtype, g, nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) b[d]->fill(dtype, n, value(global(d)));
    BroadcastOptions o;
    o.root_rank = root;
    o.root_tensor = root_tensor;
    if (k_ == 1) {
      g_->broadcast(b[0]->view(dtype, n), o);
    } else {
      g_->broadcast_multigpu(views(b, dtype, n), o);
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(dtype, b[d]->read(dtype, n), value(root * k_ + root_tensor),
                    where("broadcast", d));
    }
  }

  // Outputs: per device, nranks() blocks, either back to back in one buffer or one buffer each.
  void allgather(DType dtype, bool contiguous) {
    const int64_t n = kCount;
    auto in = buffers(dtype, n);
    auto value = [&](int g) {
      return [=](int64_t i) { return input_value(ReduceOp::kMax, dtype, g, nranks(), i); };
    };
    for (int d = 0; d < k_; ++d) in[d]->fill(dtype, n, value(global(d)));
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> out(k_);
    std::vector<std::vector<TensorView>> lists(k_);
    for (int d = 0; d < k_; ++d) {
      for (int g = 0; g < nranks(); ++g) {
        if (contiguous && g == 0) {
          out[d].push_back(std::make_unique<DeviceBuffer>(global(d), nranks() * n * dtype_size(dtype)));
        } else if (!contiguous) {
          out[d].push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
        }
        lists[d].push_back(contiguous ? out[d][0]->view(dtype, n, g * n) : out[d][g]->view(dtype, n));
      }
    }
    if (k_ == 1 && contiguous) {
      g_->allgather(out[0][0]->view(dtype, nranks() * n), in[0]->view(dtype, n));
    } else if (k_ == 1) {
      g_->allgather(lists[0], in[0]->view(dtype, n));
    } else {
      g_->allgather_multigpu(lists, views(in, dtype, n));
    }
    for (int d = 0; d < k_; ++d) {
      for (int g = 0; g < nranks(); ++g) {
        const auto got = contiguous ? out[d][0]->read(dtype, n, g * n) : out[d][g]->read(dtype, n);
        expect_values(dtype, got, value(g), where("allgather", d) + " block " + std::to_string(g));
      }
    }
  }

  // Inputs: per device, nranks() blocks (block g goes to NCCL rank g), back to back or separate.
  void reduce_scatter(DType dtype, ReduceOp op, bool contiguous) {
    const int64_t n = kCount;
    auto out = buffers(dtype, n);
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> in(k_);
    std::vector<std::vector<TensorView>> lists(k_);
    for (int d = 0; d < k_; ++d) {
      auto block = [&](int g) {
        return [=](int64_t i) { return input_value(op, dtype, global(d), nranks(), g * n + i); };
      };
      for (int g = 0; g < nranks(); ++g) {
        if (contiguous && g == 0) {
          in[d].push_back(std::make_unique<DeviceBuffer>(global(d), nranks() * n * dtype_size(dtype)));
        } else if (!contiguous) {
          in[d].push_back(std::make_unique<DeviceBuffer>(global(d), n * dtype_size(dtype)));
        }
        DeviceBuffer& buf = contiguous ? *in[d][0] : *in[d][g];
        buf.fill(dtype, n, block(g), contiguous ? g * n : 0);
        lists[d].push_back(contiguous ? buf.view(dtype, n, g * n) : buf.view(dtype, n));
      }
    }
    ReduceScatterOptions o;
    o.reduce_op = op;
    if (k_ == 1 && contiguous) {
      g_->reduce_scatter(out[0]->view(dtype, n), in[0][0]->view(dtype, nranks() * n), o);
    } else if (k_ == 1) {
      g_->reduce_scatter(out[0]->view(dtype, n), lists[0], o);
    } else {
      g_->reduce_scatter_multigpu(views(out, dtype, n), lists, o);
    }
    for (int d = 0; d < k_; ++d) {
      const int64_t base = global(d) * n;
      expect_values(dtype, out[d]->read(dtype, n),
                    [&](int64_t i) { return expected_reduction(op, dtype, nranks(), base + i); },
                    where("reduce_scatter", d));
    }
  }

  // Around a ring: device s of rank r sends to device (s + 1) % k of rank r + 1. Even ranks send
  // first, odd ranks receive first, and both ends take the devices in the same order, so the
  // two-rank communicators of every pair meet without a cycle.
  void send_recv() {
    const DType dtype = DType::kInt32;
    const int64_t n = 1000;
    const int next = (rank_ + 1) % world_;
    const int prev = (rank_ + world_ - 1) % world_;
    auto value = [&](int from_rank, int from_device) {
      return [=](int64_t i) { return static_cast<double>(from_rank * 1000 + from_device * 100 + i % 97); };
    };
    auto out = buffers(dtype, n);
    auto in = buffers(dtype, n);
    for (int d = 0; d < k_; ++d) out[d]->fill(dtype, n, value(rank_, d));
    auto sends = [&] {
      for (int s = 0; s < k_; ++s) {
        SendOptions o;
        o.dst_device_index = next * k_ + (s + 1) % k_;  // a CUDA device index of that process
        g_->send_multigpu(out[s]->view(dtype, n), next, 0, o);
      }
    };
    auto recvs = [&] {
      for (int s = 0; s < k_; ++s) {
        RecvOptions o;
        o.src_device_index = prev * k_ + s;
        g_->recv_multigpu(in[(s + 1) % k_]->view(dtype, n), prev, 0, o);
      }
    };
    if (rank_ % 2 == 0) {
      sends();
      recvs();
    } else {
      recvs();
      sends();
    }
    for (int d = 0; d < k_; ++d) {
      expect_values(dtype, in[d]->read(dtype, n), value(prev, (d + k_ - 1) % k_),
                    where("recv", d));
    }
  }

  // The caller's stream: a 100 ms pause, the input's upload, the allreduce, the download. An op
  // that did not wait for the stream's earlier work would reduce stale input.
  void ordered_after_a_delayed_stream() {
    const DType dtype = DType::kFloat32;
    const int64_t n = 4096;
    DeviceBuffer buf(global(0), n * 4);
    buf.fill(dtype, n, [](int64_t) { return -1.0; });
    float* host = nullptr;
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), n * 4), cudaSuccess);
    for (int64_t i = 0; i < n; ++i) {
      host[i] = static_cast<float>(input_value(ReduceOp::kSum, dtype, global(0), nranks(), i));
    }
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr);
    cudaMemcpyAsync(buf.data(), host, n * 4, cudaMemcpyHostToDevice, s);
    AllreduceOptions o;
    o.stream = s;
    g_->allreduce(buf.view(dtype, n), o);
    cudaMemcpyAsync(host, buf.data(), n * 4, cudaMemcpyDeviceToHost, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<double> got(host, host + n);
    expect_values(dtype, got, [&](int64_t i) { return expected_reduction(ReduceOp::kSum, dtype, nranks(), i); },
                  where("allreduce after a delayed caller stream", 0));
    cudaStreamDestroy(s);
    cudaFreeHost(host);
  }

  // An op on an explicit (non-blocking) stream, held back 100 ms: synchronize(device) must wait
  // for it, although the device's default stream never waited for that stream.
  void synchronize_waits_for_an_explicit_stream() {
    const DType dtype = DType::kInt64;
    const int64_t n = 4096;
    DeviceBuffer buf(global(0), n * 8);
    buf.fill(dtype, n, [&](int64_t i) { return input_value(ReduceOp::kSum, dtype, global(0), nranks(), i); });
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }, nullptr);
    AllreduceOptions o;
    o.stream = s;
    g_->allreduce(buf.view(dtype, n), o);
    g_->synchronize(Device::cuda(global(0)));
    expect_values(dtype, buf.read(dtype, n),
                  [&](int64_t i) { return expected_reduction(ReduceOp::kSum, dtype, nranks(), i); },
                  where("allreduce on an explicit stream, after synchronize", 0));
    cudaStreamDestroy(s);
  }

  std::shared_ptr<CollectiveGroup> g_;
  int rank_;
  int world_;
  int k_;
};

TEST(NcclWorldChild, EveryOpAndDtype) {
  if (env_str("TUTTI_NCCL_TEST_STORE").empty()) {
    GTEST_SKIP() << "runs only as a child of NcclWorld.EveryOpAndDtype";
  }
  const int rank = env_int("TUTTI_NCCL_TEST_RANK", 0);
  const int world = env_int("TUTTI_NCCL_TEST_WORLD", 1);
  const int devices = env_int("TUTTI_NCCL_TEST_DEVICES", 1);
  {
    GroupOptions o;
    o.store_url = env_str("TUTTI_NCCL_TEST_STORE");
    o.timeout = std::chrono::seconds(60);
    auto g = CollectiveGroup::create(world, rank, "nccl", "world", o);
    Rank(g, rank, world, devices).run();
    g->destroy();
  }
  expect_standin_clean("after destroy");
  if (!::testing::Test::HasFailure()) std::printf("EVERY OP OK\n");
}

class NcclWorld : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(NcclWorld, EveryOpAndDtype) {
  const auto [world, devices] = GetParam();
  SKIP_WITHOUT_GPUS(world * devices);
  TempDir dir;
  const std::string tag = "world" + std::to_string(::getpid()) + "x" + std::to_string(world) +
                          "x" + std::to_string(devices);
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < world; ++r) {
    envs.push_back({"TUTTI_NCCL_TEST_RANK=" + std::to_string(r),
                    "TUTTI_NCCL_TEST_WORLD=" + std::to_string(world),
                    "TUTTI_NCCL_TEST_DEVICES=" + std::to_string(devices),
                    "TUTTI_NCCL_TEST_STORE=file://" + dir.path() + "/store",
                    "TUTTI_STANDIN_TAG=" + tag});
  }
  const auto results =
      run_children("NcclWorldChild.EveryOpAndDtype", envs, std::chrono::seconds(240));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("EVERY OP OK"), std::string::npos)
        << "rank " << r << ":\n" << results[r].output;
  }
  EXPECT_TRUE(standin_segments(tag).empty()) << "shared-memory segments left in /dev/shm";
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclWorld,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_devices" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tutti::testing
