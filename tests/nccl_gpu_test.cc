// The NCCL backend on a real GPU (ctest label "gpu"): every op at world size 1, the
// multi-GPU API with one device, stream ordering against the caller's stream, the Work of an op
// (complete only once its stream has run it, async ops through the group API, a stuck op's Work
// ending with kTimeout, abort from another thread ending a pending Work), a stuck stream
// aborting the group, and two processes on one GPU refused. Each test skips, saying why, where
// no GPU or no NCCL is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "reference.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

std::string why_no_gpu() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device visible";
  if (!is_backend_available("nccl")) {
    return "NCCL does not load (put libnccl.so.2 on LD_LIBRARY_PATH or set TUTTI_NCCL_LIBRARY)";
  }
  return "";
}

#define SKIP_WITHOUT_GPU()                   \
  do {                                       \
    const std::string why_ = why_no_gpu();   \
    if (!why_.empty()) GTEST_SKIP() << why_; \
  } while (0)

// Device memory for a test, zeroed (and waited for: cudaMemset is asynchronous, and ops on a
// non-blocking stream are not ordered after it), freed at scope end.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    cudaMemset(ptr, 0, bytes);
    cudaDeviceSynchronize();
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  TensorView view(DType dtype, int64_t n) const {
    return TensorView(ptr, dtype, {n}, Device::cuda(0));
  }
  void upload(const void* host) const { cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice); }
  void download(void* host) const { cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost); }
  void* ptr = nullptr;
  size_t bytes;
};

class NcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cudaSetDevice(0);
    GroupOptions o;
    o.timeout = std::chrono::seconds(20);
    group_ = CollectiveGroup::create(1, 0, "nccl", unique_name("gpu"), o);
  }
  std::shared_ptr<CollectiveGroup> group_;
};

const DType kDTypes[] = {DType::kBool,     DType::kInt8,    DType::kUInt8,  DType::kInt32,
                         DType::kUInt32,   DType::kInt64,   DType::kUInt64, DType::kFloat16,
                         DType::kBFloat16, DType::kFloat32, DType::kFloat64};

// At one rank NCCL copies (allgather, reduce_scatter; alltoall, allgatherv, gather and scatter
// copy the own block) or does nothing (in-place allreduce, reduce, broadcast): this checks the
// plumbing of every op and dtype, not arithmetic, which one GPU cannot show (NCCL refuses two
// ranks on one GPU). nccl_world_test checks the values at world sizes 2 and 4 with several GPUs
// per process (on the stand-in in CI).
TEST_F(NcclGpu, EveryCollectiveAtWorldSizeOne) {
  const int64_t n = 1003;
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(to_string(dtype));
    const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
    std::vector<uint64_t> host(bytes / 8 + 1), back(bytes / 8 + 1);
    for (int64_t i = 0; i < n; ++i)
      write_value(dtype, host.data(), i, input_value(ReduceOp::kMax, dtype, 0, 1, i));
    DeviceBuffer in(bytes), out(bytes);
    in.upload(host.data());
    auto expect_input = [&](const DeviceBuffer& b, const char* what) {
      b.download(back.data());
      EXPECT_EQ(std::memcmp(back.data(), host.data(), bytes), 0) << what;
    };
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
      if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
      AllreduceOptions o;
      o.reduce_op = op;
      o.blocking = true;
      group_->allreduce(in.view(dtype, n), o);  // one rank: the reduction is the input itself
      expect_input(in, "allreduce");
    }
    ReduceOptions r;
    r.blocking = true;
    group_->reduce(in.view(dtype, n), r);
    expect_input(in, "reduce");
    BroadcastOptions b;
    group_->broadcast(in.view(dtype, n), b);
    group_->synchronize(Device::cuda(0));
    expect_input(in, "broadcast");
    group_->allgather(out.view(dtype, n), in.view(dtype, n));
    group_->synchronize(Device::cuda(0));
    expect_input(out, "allgather into one buffer");
    cudaMemset(out.ptr, 0, bytes);
    group_->reduce_scatter(out.view(dtype, n), in.view(dtype, n));
    group_->synchronize(Device::cuda(0));
    expect_input(out, "reduce_scatter");
    cudaMemset(out.ptr, 0, bytes);
    group_->allgather(std::vector<TensorView>{out.view(dtype, n)}, in.view(dtype, n));
    group_->synchronize(Device::cuda(0));
    expect_input(out, "allgather, list form");
    // The ops built on grouped sends and receives: at one rank, the own block's copy.
    const TensorView i = in.view(dtype, n), o = out.view(dtype, n);
    const std::vector<std::pair<const char*, std::function<void()>>> copies = {
        {"alltoall", [&] { group_->alltoall(o, i); }},
        {"alltoall, lists",
         [&] { group_->alltoall(std::vector<TensorView>{o}, std::vector<TensorView>{i}); }},
        {"alltoallv", [&] { group_->alltoallv(o, i, {n}, {n}); }},
        {"allgatherv", [&] { group_->allgatherv(o, i, {n}); }},
        {"gather", [&] { group_->gather(o, i); }},
        {"gather, list", [&] { group_->gather(std::vector<TensorView>{o}, i); }},
        {"scatter", [&] { group_->scatter(o, i); }},
        {"scatter, list", [&] { group_->scatter(o, std::vector<TensorView>{i}); }},
    };
    for (const auto& [what, op] : copies) {
      cudaMemset(out.ptr, 0, bytes);
      op();
      group_->synchronize(Device::cuda(0));
      expect_input(out, what);
    }
  }
  group_->barrier();
}

TEST_F(NcclGpu, MultiGpuApiWithOneDevice) {
  const int64_t n = 4096;
  std::vector<float> host(n), back(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 97);
  DeviceBuffer in(n * 4), out(n * 4);
  in.upload(host.data());
  group_->allreduce_multigpu({in.view(DType::kFloat32, n)});
  group_->allgather_multigpu({{out.view(DType::kFloat32, n)}}, {in.view(DType::kFloat32, n)});
  group_->synchronize(Device::cuda(0));
  out.download(back.data());
  EXPECT_EQ(back, host);
}

TEST_F(NcclGpu, OrderedAfterTheCallersStream) {
  // The caller's stream: a 200 ms pause, then the input's upload, then the allgather, then the
  // download. If the op did not wait for the stream's earlier work it would read zeros. The
  // host buffers are pinned: a copy from pageable memory may synchronise with the host, which
  // would wait out the pause before the op is even enqueued.
  const int64_t n = 1 << 20;
  float* host = nullptr;
  float* back = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&back), n * 4), cudaSuccess);
  std::fill(host, host + n, 7.0f);
  std::fill(back, back + n, 0.0f);
  DeviceBuffer in(n * 4), out(n * 4);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(milliseconds(200)); }, nullptr);
  cudaMemcpyAsync(in.ptr, host, n * 4, cudaMemcpyHostToDevice, s);
  AllgatherOptions o;
  o.stream = s;
  group_->allgather(out.view(DType::kFloat32, n), in.view(DType::kFloat32, n), o);
  cudaMemcpyAsync(back, out.ptr, n * 4, cudaMemcpyDeviceToHost, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(std::vector<float>(back, back + n), std::vector<float>(host, host + n));
  cudaStreamDestroy(s);
  cudaFreeHost(host);
  cudaFreeHost(back);
}

std::atomic<bool> g_held{false};

// Holds stream `s` by a host function until g_held is cleared (or 10 s have passed).
void hold(cudaStream_t s) {
  g_held = true;
  cudaLaunchHostFunc(
      s,
      [](void*) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (g_held && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(milliseconds(1));
        }
      },
      nullptr);
}

// A new caller stream, held (above).
cudaStream_t held_stream() {
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  hold(s);
  return s;
}

// The caller's stream is held until the test has looked (a 300 ms sleep until 2026-12-05: a
// loaded machine could take longer to issue the op): the op's Work is not complete before then,
// a short wait says so without harming the group, and wait() returns once the stream has run the
// op.
TEST_F(NcclGpu, AWorkCompletesOnlyOnceItsStreamRanTheOp) {
  const int64_t n = 4096;
  DeviceBuffer buf(n * 4);
  cudaStream_t s = held_stream();
  AllreduceOptions o;
  o.stream = s;
  auto work = group_->allreduce(buf.view(DType::kFloat32, n), o);
  ASSERT_NE(work, nullptr);
  EXPECT_FALSE(work->is_completed());
  EXPECT_EQ(work->exception(), nullptr);
  try {
    work->wait(milliseconds(20));
    ADD_FAILURE() << "a 20 ms wait returned before the stream released the op";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("still running"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(group_->is_aborted());
  g_held = false;
  work->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(work->is_success());
  // async_op gives the same (NCCL ops always return once enqueued), and blocking waits first.
  DeviceBuffer out(n * 4);  // before the hold: it synchronises the device
  hold(s);
  AllgatherOptions async;
  async.stream = s;
  async.async_op = true;
  auto gathered =
      group_->allgather(out.view(DType::kFloat32, n), buf.view(DType::kFloat32, n), async);
  EXPECT_FALSE(gathered->is_completed());
  g_held = false;
  AllreduceOptions blocking;
  blocking.stream = s;
  blocking.blocking = true;
  EXPECT_TRUE(group_->allreduce(buf.view(DType::kFloat32, n), blocking)->is_completed());
  EXPECT_TRUE(gathered->is_completed()) << "ran after an op that has finished on the same stream";
  cudaStreamDestroy(s);
}

// The Work of an op that cannot finish within its 300 ms timeout ends with kTimeout naming the
// op, while the stream is still held; the group is aborted.
TEST_F(NcclGpu, TheWorkOfAStuckOpEndsWithTimeoutNamingIt) {
  DeviceBuffer buf(1024);
  cudaStream_t s = held_stream();
  AllreduceOptions o;
  o.stream = s;
  o.timeout = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  auto work = group_->allreduce(buf.view(DType::kFloat32, 256), o);
  try {
    work->wait();
    ADD_FAILURE() << "the Work of a stuck op succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("allreduce #0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not complete within its timeout"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(g_held.load()) << "the Work ended only once the stream was released";
  EXPECT_TRUE(group_->is_aborted());
  g_held = false;
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

// abort() from another thread ends a pending Work with kAborted naming the op and the reason,
// long before its 20 s timeout, and every later op too.
TEST_F(NcclGpu, AbortFromAnotherThreadEndsAPendingWork) {
  DeviceBuffer buf(1024);
  cudaStream_t s = held_stream();
  AllreduceOptions o;
  o.stream = s;
  auto work = group_->allreduce(buf.view(DType::kFloat32, 256), o);
  const auto start = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    group_->abort("the test says stop");
  });
  try {
    work->wait();
    ADD_FAILURE() << "the Work of an aborted op succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("allreduce #0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the test says stop"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(g_held.load());
  aborter.join();
  try {
    group_->allreduce(buf.view(DType::kFloat32, 256));
    ADD_FAILURE() << "an op after abort ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("the test says stop"), std::string::npos) << e.what();
  }
  g_held = false;
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

std::atomic<bool> g_release{false};

TEST_F(NcclGpu, AStuckStreamPastTheTimeoutAbortsTheGroup) {
  // The caller's stream is held by a host function until released; the op, queued behind it,
  // cannot finish within its 500 ms timeout: the watchdog aborts the communicators.
  DeviceBuffer buf(1024);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  g_release = false;
  cudaLaunchHostFunc(
      s,
      [](void*) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!g_release && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(milliseconds(1));
        }
      },
      nullptr);
  // Released at the latest by a timer thread after 3 s (well past the timeout), not only by
  // this thread, which NCCL's abort might block (review #3).
  std::thread timer([] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!g_release && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    g_release = true;
  });
  AllreduceOptions o;
  o.stream = s;
  o.timeout = milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  group_->allreduce(buf.view(DType::kFloat32, 256), o);  // returns once enqueued
  // Later calls fail with kAborted naming the op that hung, once the watchdog has acted (within
  // the timeout plus a margin).
  std::string message;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    try {
      group_->allreduce(buf.view(DType::kFloat32, 256));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
      message = e.what();
      break;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  g_release = true;
  timer.join();
  ASSERT_FALSE(message.empty()) << "no abort within 5 s of a 500 ms timeout";
  EXPECT_NE(message.find("allreduce #0"), std::string::npos) << message;
  EXPECT_NE(message.find("did not complete within its timeout"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Destroy, then the same name again works.
  const std::string name = group_->name();
  group_->destroy();
  GroupOptions fresh;
  fresh.timeout = std::chrono::seconds(20);
  auto again = CollectiveGroup::create(1, 0, "nccl", name + "-again", fresh);
  AllreduceOptions blocking;
  blocking.blocking = true;
  again->allreduce(buf.view(DType::kFloat32, 256), blocking);
  cudaStreamDestroy(s);
}

// Two processes of one group on the same GPU: this binary runs itself twice as the child.
TEST(NcclChild, JoinOnGpuZero) {
  const char* rank = std::getenv("TUTTI_NCCL_TEST_CHILD");
  if (rank == nullptr) GTEST_SKIP() << "runs only as a child of TwoProcessesOnOneGpuAreRefused";
  cudaSetDevice(0);
  GroupOptions o;
  o.store_url = std::getenv("TUTTI_NCCL_TEST_STORE");
  o.timeout = std::chrono::seconds(20);
  auto g = CollectiveGroup::create(2, std::atoi(rank), "nccl", "shared-gpu", o);
  DeviceBuffer buf(64);
  try {
    AllreduceOptions b;
    b.blocking = true;
    g->allreduce(buf.view(DType::kFloat32, 16), b);
    ADD_FAILURE() << "two ranks on one GPU were not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("both use GPU"), std::string::npos) << e.what();
    std::printf("REFUSED: %s\n", e.what());
  }
}

TEST(NcclProcesses, TwoProcessesOnOneGpuAreRefused) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < 2; ++r) {
    envs.push_back({"TUTTI_NCCL_TEST_CHILD=" + std::to_string(r),
                    "TUTTI_NCCL_TEST_STORE=file://" + dir.path() + "/store"});
  }
  auto results = run_processes({"/proc/self/exe", "--gtest_filter=NcclChild.JoinOnGpuZero"}, envs,
                               milliseconds(60000));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("REFUSED"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace tutti::testing
