// The cuda_ipc direct transport. Run twice by ctest: against the stand-in CUDA runtime
// (standin.cuda_ipc_test: device memory is memfd-backed there, so IPC handles really cross
// processes and the transport's host logic runs end to end), and on a real GPU
// (gpu.cuda_ipc_test, label gpu: every test skips, saying why, where no GPU is visible).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "tutti/transfer_agent.h"

extern char** environ;

namespace tutti {
namespace {

using namespace std::chrono_literals;

// The stand-in's count of opened IPC handles, or -1 on a real CUDA runtime.
int ipc_opens() {
  auto fn = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "tutti_standin_cuda_ipc_opens"));
  return fn != nullptr ? fn() : -1;
}

#define REQUIRE_GPU()                                                                          \
  do {                                                                                         \
    int n = 0;                                                                                 \
    const cudaError_t rc = cudaGetDeviceCount(&n);                                             \
    if (rc != cudaSuccess || n == 0) {                                                         \
      GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount: " << cudaGetErrorString(rc) \
                   << ", " << n << " devices)";                                                \
    }                                                                                          \
  } while (0)

std::shared_ptr<TransferAgent> make_agent(const std::string& name) {
  TransferAgentOptions o;
  o.name = name;
  return TransferAgent::create(o);
}

using tutti::testing::expect_error;

std::vector<uint8_t> to_host(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  EXPECT_EQ(cudaMemcpy(out.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// Device memory freed with the object.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  TensorView view(size_t offset = 0, size_t n = 0) const {
    return TensorView(static_cast<char*>(p) + offset, DType::kUInt8,
                      {static_cast<int64_t>(n ? n : bytes - offset)}, Device::cuda(0));
  }
  void* p = nullptr;
  size_t bytes;
};

// `ref` with tensor `index`'s offset and allocation size in its cuda_ipc bytes replaced
// (cuda_ipc_places.h: a 16-byte UUID and a 64-byte event, then 96 bytes a tensor: a 64-byte
// handle, offset, size, buffer id, base).
TensorRef with_place(const TensorRef& ref, size_t index, uint64_t offset, uint64_t size) {
  std::string blob = ref.blob();
  const size_t at = 16 + 64 + index * 96 + 64;
  for (int i = 0; i < 8; ++i) {
    blob.at(at + i) = static_cast<char>(offset >> (8 * i));
    blob.at(at + 8 + i) = static_cast<char>(size >> (8 * i));
  }
  return TensorRef(ref.owner(), ref.object(), ref.transport(), ref.tensors(), ref.places(), blob,
                   ref.is_two_sided());
}

TEST(CudaIpc, WrongDevicesAreRefusedBeforeAnyIo) {
  REQUIRE_GPU();
  auto owner = make_agent("owner");
  std::vector<float> host(16, 1.0f);
  PutOptions ipc;
  ipc.transport = "cuda_ipc";
  Error e = expect_error([&] { owner->put({TensorView(host)}, ipc); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("carries CUDA tensors"), std::string::npos) << e.what();
  DeviceBuffer d(4096);
  PutOptions shm;
  shm.transport = "shm";
  e = expect_error([&] { owner->put({d.view()}, shm); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("carries CPU tensors"), std::string::npos) << e.what();
  // Pinned host memory called a CUDA tensor cannot be exported.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4096), cudaSuccess);
  e = expect_error(
      [&] { owner->put({TensorView(pinned, DType::kUInt8, {4096}, Device::cuda(0))}, ipc); },
      ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("not device memory"), std::string::npos) << e.what();
  cudaFreeHost(pinned);
}

// Two agents of one process: the same code path, the owner's addresses used directly.
TEST(CudaIpc, InProcessCopyAndBorrow) {
  REQUIRE_GPU();
  auto owner = make_agent("owner");
  auto consumer = make_agent("consumer");
  DeviceBuffer src(1 << 20);
  std::vector<uint8_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 5 + 1);
  ASSERT_EQ(cudaMemcpy(src.p, pattern.data(), pattern.size(), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  PutOptions ipc;
  ipc.transport = "cuda_ipc";
  ipc.stream = stream;
  ObjectHandle h = owner->put({src.view(0, 4096), src.view(256 << 10, 64 << 10)}, ipc);
  DeviceBuffer t0(4096), t1(64 << 10);
  GetOptions g;
  g.targets = {t0.view(), t1.view()};
  g.stream = stream;
  consumer->get(h.ref(), g);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(to_host(t0.view()), std::vector<uint8_t>(pattern.begin(), pattern.begin() + 4096));
  EXPECT_EQ(to_host(t1.view()),
            std::vector<uint8_t>(pattern.begin() + (256 << 10), pattern.begin() + (320 << 10)));
  // CPU targets and no targets are refused before any I/O.
  std::vector<uint8_t> cpu(4096), cpu1(64 << 10);
  GetOptions bad;
  bad.targets = {TensorView(cpu), TensorView(cpu1)};
  Error e = expect_error([&] { consumer->get(h.ref(), bad); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("receives into CUDA memory"), std::string::npos) << e.what();
  expect_error([&] { consumer->get(h.ref()); }, ErrorCode::kInvalidArgument);
  // A ref that puts tensor 1 past the end of the 1 MiB allocation, within the larger size it
  // claims: refused by the allocation's size as the driver gives it, before any copy.
  EXPECT_TUTTI_ERROR(consumer->get(with_place(h.ref(), 1, uint64_t{1} << 30, uint64_t{1} << 31), g),
                     ErrorCode::kInvalidArgument, "tensor 1",
                     "past the end of the owner's allocation as this process sees it");
  {
    Borrowed b = consumer->borrow(h.ref());
    ASSERT_EQ(b.tensors().size(), 2u);
    EXPECT_EQ(b.tensors()[1].device(), Device::cuda(0));
    EXPECT_EQ(to_host(b.tensors()[1]),
              std::vector<uint8_t>(pattern.begin() + (256 << 10), pattern.begin() + (320 << 10)));
    h.release();
    expect_error([&] { owner->wait_tensor_freed(src.view(), 50ms); }, ErrorCode::kTimeout);
  }
  owner->wait_tensor_freed(src.view(), 10s);
  cudaStreamDestroy(stream);
}

bool wait_file(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

// The owner in another process: handles are opened once and cached, events are opened from
// their handles, borrows map the owner's allocation.
TEST(CudaIpc, AcrossProcessesHandlesAreOpenedOnceAndCached) {
  REQUIRE_GPU();
  testing::TempDir dir;
  // The build's worker, or the one next to this binary (the device bundle).
  std::string worker = TUTTI_CUDA_IPC_WORKER;
  if (::access(worker.c_str(), X_OK) != 0) {
    char self[4096] = {0};
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string dir_of_self = n > 0 ? std::string(self, static_cast<size_t>(n)) : ".";
    worker = dir_of_self.substr(0, dir_of_self.rfind('/')) + "/cuda_ipc_worker";
  }
  std::vector<char*> argv = {worker.data(), const_cast<char*>("owner"),
                             const_cast<char*>(dir.path().c_str()), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, worker.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid <= 0) return;
      int status;
      if (::waitpid(pid, &status, WNOHANG) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
    }
  } reap{pid};
  ASSERT_TRUE(wait_file(dir.path() + "/ref", 60s)) << "the owner never published";
  std::ifstream in(dir.path() + "/ref");
  std::stringstream text;
  text << in.rdbuf();
  const TensorRef ref = TensorRef::from_text(text.str());
  ASSERT_EQ(ref.transport(), "cuda_ipc");
  auto consumer = make_agent("cuda-consumer");
  DeviceBuffer t0(256 << 10), t1(256 << 10), t2(64 << 10);
  GetOptions g;
  g.targets = {t0.view(), t1.view(), t2.view()};
  auto expect_a = [](const std::vector<uint8_t>& got, size_t from) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != static_cast<uint8_t>((from + i) * 7 + 3)) {
        ADD_FAILURE() << "byte " << i << " of the tensor at " << from;
        return;
      }
    }
  };
  auto expect_b = [](const std::vector<uint8_t>& got) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != static_cast<uint8_t>(i * 11 + 1)) {
        ADD_FAILURE() << "byte " << i << " of tensor 2";
        return;
      }
    }
  };
  const int before = ipc_opens();
  consumer->get(ref, g);
  expect_a(to_host(t0.view()), 0);
  expect_a(to_host(t1.view()), 512 << 10);
  expect_b(to_host(t2.view()));
  const int after_first = ipc_opens();
  cudaMemset(t2.p, 0, 64 << 10);
  consumer->get(ref, g);  // warm: nothing opened again
  expect_b(to_host(t2.view()));
  if (before >= 0) {
    EXPECT_EQ(after_first - before, 2);  // two allocations, the first one holding two tensors
    EXPECT_EQ(ipc_opens(), after_first);
  }
  {
    Borrowed b = consumer->borrow(ref);
    ASSERT_EQ(b.tensors().size(), 3u);
    EXPECT_NE(b.tensors()[0].data(), nullptr);
    expect_a(to_host(b.tensors()[1]), 512 << 10);
    expect_b(to_host(b.tensors()[2]));
  }
  if (before >= 0) EXPECT_EQ(ipc_opens(), after_first);
  {
    // A ref that puts tensor 2 past the end of its allocation as this process opened it, within
    // the (larger) size the ref claims: refused by the size the driver gives, before any copy.
    // (Where a driver gave no size for an opened handle the copy would read past the mapping:
    // a failure here, with the device's illegal-address error, says so.)
    const TensorRef past = with_place(ref, 2, uint64_t{1} << 30, uint64_t{1} << 31);
    EXPECT_TUTTI_ERROR(consumer->get(past, g), ErrorCode::kInvalidArgument, "tensor 2",
                       "past the end of the owner's allocation as this process sees it");
  }
  std::ofstream(dir.path() + "/done") << "1";
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  reap.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace tutti
