// CollectiveGroup::allocate_symmetric: memory every rank's ops reach, and the shm backend's
// single-copy allreduce on it (each rank reduces its slice from every rank's tensor and writes
// it into every rank's tensor). Ranks as threads; expected values computed here, per element,
// from each rank's inputs.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

// What rank r puts at element i: small integers, so every sum is exact in float32.
double input(int r, size_t i) {
  return static_cast<double>((i * 13 + static_cast<size_t>(r) * 5) % 17) - 8.0;
}

template <typename T>
T reduced(ReduceOp op, int world, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = input(r, i);
    acc = op == ReduceOp::kMax ? std::max(acc, v) : op == ReduceOp::kMin ? std::min(acc, v) : acc + v;
  }
  return static_cast<T>(op == ReduceOp::kAvg ? acc / world : acc);
}

// This process's names in /dev/shm for symmetric memory.
std::vector<std::string> symmetric_files() {
  const std::string prefix =
      "tutti-sym-" + std::to_string(::getuid()) + "-" + std::to_string(::getpid()) + "-";
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

// Every rank allreduces `count` elements of T at a different offset of its symmetric memory
// (so the ranks' offsets differ), `reps` times, and checks every element.
template <typename T>
void allreduce_in_symmetric_memory(int world, size_t count, ReduceOp op, int reps = 2) {
  SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(count) + " elements");
  auto groups = create_groups(world, "shm", unique_name("sym"), milliseconds(20000));
  run_ranks(world, [&](int r) {
    auto mem = groups[r]->allocate_symmetric(count * sizeof(T) + 4096);
    ASSERT_TRUE(mem->symmetric());
    const size_t offset = static_cast<size_t>(r) * 64;
    TensorView t = mem->view(dtype_of<T>(), {static_cast<int64_t>(count)}, offset);
    T* v = static_cast<T*>(t.data());
    for (int rep = 0; rep < reps; ++rep) {
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(input(r, i));
      AllreduceOptions o;
      o.reduce_op = op;
      groups[r]->allreduce(t, o);
      size_t wrong = 0, first = count;
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != reduced<T>(op, world, i)) {
          if (wrong++ == 0) first = i;
        }
      }
      EXPECT_EQ(wrong, 0u) << "rank " << r << ", rep " << rep << ": first wrong at " << first
                           << ": " << +v[first] << " for " << +reduced<T>(op, world, first);
    }
  });
}

TEST(Symmetric, AllreduceInSymmetricMemoryGivesEveryRankTheReduction) {
  // Just above the small-message path (16 KiB), odd counts, and several chunks' worth.
  for (int world : {2, 3, 4}) {
    allreduce_in_symmetric_memory<float>(world, 4099, ReduceOp::kSum);
    allreduce_in_symmetric_memory<float>(world, 262147, ReduceOp::kSum);
  }
  allreduce_in_symmetric_memory<int64_t>(3, 300001, ReduceOp::kMax);
  allreduce_in_symmetric_memory<int32_t>(2, 70001, ReduceOp::kMin);
  allreduce_in_symmetric_memory<double>(4, 1 << 20, ReduceOp::kAvg, 1);
}

// Three ranks allreduce 100003 floats three times, from symmetric memory but for rank
// `outside` (-1: none), which uses a vector of its own. Returns how many debug lines said
// "single-copy allreduce", or -1 (saying why on stderr) if a result was wrong.
int single_copy_lines(int outside) {
  const size_t count = 100003;
  auto groups = create_groups(3, "shm", unique_name("sym-mixed"), milliseconds(20000));
  std::atomic<size_t> wrong{0};
  ::testing::internal::CaptureStderr();
  run_ranks(3, [&](int r) {
    auto mem = groups[r]->allocate_symmetric(count * sizeof(float));
    std::vector<float> plain(count);
    float* v = r == outside ? plain.data() : static_cast<float*>(mem->data());
    for (int rep = 0; rep < 3; ++rep) {
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(input(r, i));
      groups[r]->allreduce(TensorView(v, DType::kFloat32, {static_cast<int64_t>(count)}));
      for (size_t i = 0; i < count; ++i) wrong += v[i] != reduced<float>(ReduceOp::kSum, 3, i);
    }
    groups[r]->barrier();  // no rank drops its memory while another still runs the op
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  if (wrong > 0) {
    std::fprintf(stderr, "rank outside %d: %zu wrong elements\n", outside, wrong.load());
    return -1;
  }
  int single = 0;
  for (size_t at = log.find("single-copy allreduce"); at != std::string::npos;
       at = log.find("single-copy allreduce", at + 1)) {
    ++single;
  }
  return single;
}

// The single-copy path is taken where every rank's tensor is in symmetric memory (its debug
// line), and not where one rank's is not: then every rank takes the staged path, together. In
// a process of its own (the threadsafe death test runs it anew), whose logger starts at debug.
TEST(Symmetric, OneRankOutsideTurnsEveryRankToTheStagedPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ::setenv("TUTTI_LOG_LEVEL", "debug", 1);
  EXPECT_EXIT(
      {
        int failed = 0;
        for (int outside : {-1, 0, 2}) {
          const int lines = single_copy_lines(outside);
          const int want = outside < 0 ? 9 : 0;
          if (lines != want) {
            std::fprintf(stderr, "rank outside %d: %d single-copy lines, expected %d\n", outside,
                         lines, want);
            failed = 1;
          }
        }
        std::exit(failed);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Symmetric, NothingIsLeftInDevShmAndPeersKeepTheirMappings) {
  auto groups = create_groups(2, "shm", unique_name("sym-files"), milliseconds(20000));
  run_ranks(2, [&](int r) {
    auto a = groups[r]->allocate_symmetric(1 << 20);
    auto b = groups[r]->allocate_symmetric(100);
    EXPECT_TRUE(a->symmetric() && b->symmetric());
    EXPECT_EQ(b->size(), 100u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u);
    const auto* z = static_cast<const unsigned char*>(a->data());
    EXPECT_TRUE(std::all_of(z, z + a->size(), [](unsigned char c) { return c == 0; }));
    groups[r]->barrier();
    b.reset();  // dropped by this rank only: its peers still map it; ops on `a` go on
    std::vector<float> expect(262144);
    float* v = static_cast<float*>(a->data());
    for (size_t i = 0; i < expect.size(); ++i) {
      v[i] = static_cast<float>(input(r, i));
      expect[i] = reduced<float>(ReduceOp::kSum, 2, i);
    }
    groups[r]->allreduce(TensorView(v, DType::kFloat32, {262144}));
    EXPECT_EQ(std::memcmp(v, expect.data(), expect.size() * sizeof(float)), 0);
  });
  EXPECT_TRUE(symmetric_files().empty()) << symmetric_files()[0];
  for (auto& g : groups) g->destroy();
  EXPECT_TRUE(symmetric_files().empty());
}

TEST(Symmetric, ViewsAreChecked) {
  auto groups = create_groups(1, "shm", unique_name("sym-view"));
  auto mem = groups[0]->allocate_symmetric(4096);
  EXPECT_EQ(mem->view(DType::kFloat32, {1024}).numel(), 1024);
  EXPECT_EQ(mem->view(DType::kFloat64, {2, 255}, 16).data(),
            static_cast<char*>(mem->data()) + 16);
  EXPECT_TUTTI_ERROR(mem->view(DType::kFloat32, {1025}), ErrorCode::kInvalidArgument, "4100 bytes",
                     "4096 bytes");
  EXPECT_TUTTI_ERROR(mem->view(DType::kFloat32, {1}, 4094), ErrorCode::kInvalidArgument,
                     "offset 4094");
  EXPECT_TUTTI_ERROR(mem->view(DType::kFloat32, {1}, 2), ErrorCode::kInvalidArgument,
                     "multiple of 4");
  EXPECT_TUTTI_ERROR(mem->view(DType::kFloat32, {-1}), ErrorCode::kInvalidArgument,
                     "dimension 0 is -1");
  EXPECT_TUTTI_ERROR(groups[0]->allocate_symmetric(0), ErrorCode::kInvalidArgument,
                     "allocate_symmetric on group", "bytes is 0");
  groups[0]->destroy();
  EXPECT_TUTTI_ERROR(groups[0]->allocate_symmetric(64), ErrorCode::kInvalidUsage, "destroyed");
}

// A backend without symmetric memory hands out ordinary memory; ops on it work as on any.
TEST(Symmetric, GlooHandsOutOrdinaryMemory) {
  auto groups = create_groups(2, "gloo", unique_name("sym-gloo"), milliseconds(20000));
  run_ranks(2, [&](int r) {
    auto mem = groups[r]->allocate_symmetric(4000);
    EXPECT_FALSE(mem->symmetric());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(mem->data()) % 64, 0u);
    TensorView t = mem->view(DType::kInt32, {1000});
    auto* v = static_cast<int32_t*>(t.data());
    EXPECT_EQ(v[999], 0);
    for (int i = 0; i < 1000; ++i) v[i] = i * (r + 1);
    groups[r]->allreduce(t);
    EXPECT_EQ(v[999], 999 * 3);
  });
}

// The allocation is an op of the group: a rank that calls something else there is named.
TEST(Symmetric, AnAllocationAgainstAnotherOpFailsNamingTheRank) {
  auto groups = create_groups(2, "shm", unique_name("sym-mismatch"), milliseconds(5000));
  run_ranks(2, [&](int r) {
    if (r == 0) {
      EXPECT_TUTTI_ERROR(groups[0]->allocate_symmetric(1000), ErrorCode::kRemoteError,
                         "rank 1 called allreduce");
    } else {
      std::vector<uint8_t> v(258);
      EXPECT_TUTTI_ERROR(groups[1]->allreduce(v), ErrorCode::kRemoteError, "rank 0 called allgather");
    }
  });
  EXPECT_TRUE(symmetric_files().empty()) << symmetric_files()[0];
}

}  // namespace
}  // namespace tutti::testing
