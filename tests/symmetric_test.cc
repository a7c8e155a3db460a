// CollectiveGroup::allocate_symmetric: memory every rank's ops reach, and the shm backend's
// single-copy allreduce on it (each rank reduces its slice from every rank's tensor and writes
// it into every rank's tensor). Ranks as threads; expected values computed here, per element,
// from each rank's inputs.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>

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
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  return static_cast<T>(op == ReduceOp::kAvg ? acc / world : acc);
}

// This process's names in /dev/shm for symmetric memory.
std::vector<std::string> symmetric_files() {
  const std::string prefix = symmetric_file_prefix();
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// How many mappings of symmetric memory this process has (each rank's own part and its
// mappings of the others', one line each in /proc/self/maps).
int symmetric_mappings() {
  const std::string needle = "/dev/shm/" + symmetric_file_prefix();
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(needle) != std::string::npos;
  return n;
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

// allgather, reduce_scatter (one input buffer of W blocks), broadcast and reduce, each with its
// memory in symmetric memory on every rank (broadcast: the root's alone), against values
// computed here. Sizes above the small-message path, and odd.
void every_collective(int world) {
  {
    SCOPED_TRACE("world " + std::to_string(world));
    const size_t n = 50021;  // elements per rank
    const size_t w = static_cast<size_t>(world);
    auto groups = create_groups(world, "shm", unique_name("sym-ops"), milliseconds(20000));
    run_ranks(world, [&](int r) {
      auto& g = *groups[r];
      auto mem = g.allocate_symmetric((2 * w + 2) * n * sizeof(int32_t));
      auto* base = static_cast<int32_t*>(mem->data());
      int32_t* in = base;                 // n: allgather's input, then reduce_scatter's output
      int32_t* blocks = base + n;         // w * n: allgather's output, then reduce_scatter's input
      int32_t* one = base + (w + 1) * n;  // n: broadcast and reduce
      auto value = [](int rank, size_t i) { return static_cast<int32_t>(i * 3 + rank * 1000); };
      for (size_t i = 0; i < n; ++i) in[i] = value(r, i);
      g.allgather(TensorView(blocks, DType::kInt32, {static_cast<int64_t>(w * n)}),
                  TensorView(in, DType::kInt32, {static_cast<int64_t>(n)}));
      size_t wrong = 0;
      for (size_t q = 0; q < w; ++q) {
        for (size_t i = 0; i < n; ++i) wrong += blocks[q * n + i] != value(static_cast<int>(q), i);
      }
      EXPECT_EQ(wrong, 0u) << "allgather, rank " << r;
      // Rank 0's input outside: every rank takes the staged path, together.
      std::vector<int32_t> plain_in(in, in + n);
      for (size_t i = 0; i < w * n; ++i) blocks[i] = -1;
      g.allgather(
          TensorView(blocks, DType::kInt32, {static_cast<int64_t>(w * n)}),
          TensorView(r == 0 ? plain_in.data() : in, DType::kInt32, {static_cast<int64_t>(n)}));
      wrong = 0;
      for (size_t q = 0; q < w; ++q) {
        for (size_t i = 0; i < n; ++i) wrong += blocks[q * n + i] != value(static_cast<int>(q), i);
      }
      EXPECT_EQ(wrong, 0u) << "allgather with rank 0 outside, rank " << r;
      // Block q of rank r holds value(r, q * n + i); rank q gets their sum over r.
      for (size_t i = 0; i < w * n; ++i) blocks[i] = value(r, i);
      g.reduce_scatter(TensorView(in, DType::kInt32, {static_cast<int64_t>(n)}),
                       TensorView(blocks, DType::kInt32, {static_cast<int64_t>(w * n)}));
      wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        int32_t sum = 0;
        for (int q = 0; q < world; ++q) sum += value(q, static_cast<size_t>(r) * n + i);
        wrong += in[i] != sum;
      }
      EXPECT_EQ(wrong, 0u) << "reduce_scatter, rank " << r;
      // The last rank's input outside.
      std::vector<int32_t> plain_blocks(blocks, blocks + w * n);
      std::vector<int32_t> got(n, -1);
      g.reduce_scatter(TensorView(got), TensorView(r == world - 1 ? plain_blocks.data() : blocks,
                                                   DType::kInt32, {static_cast<int64_t>(w * n)}));
      EXPECT_EQ(std::memcmp(got.data(), in, n * sizeof(int32_t)), 0)
          << "reduce_scatter with the last rank outside, rank " << r;
      // Broadcast from the last rank: its tensor in symmetric memory, the others' in vectors.
      const int root = world - 1;
      std::vector<int32_t> mine(n, -1);
      int32_t* target = r == root ? one : mine.data();
      if (r == root) {
        for (size_t i = 0; i < n; ++i) one[i] = value(root, i) + 7;
      }
      BroadcastOptions bo;
      bo.root_rank = root;
      g.broadcast(TensorView(target, DType::kInt32, {static_cast<int64_t>(n)}), bo);
      wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += target[i] != value(root, i) + 7;
      EXPECT_EQ(wrong, 0u) << "broadcast, rank " << r;
      // Reduce to rank 0 (max): the others keep their tensors.
      for (size_t i = 0; i < n; ++i) one[i] = value(r, i) * (i % 2 == 0 ? 1 : -1);
      ReduceOptions ro;
      ro.root_rank = 0;
      ro.reduce_op = ReduceOp::kMax;
      g.reduce(TensorView(one, DType::kInt32, {static_cast<int64_t>(n)}), ro);
      wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        int32_t want = value(r, i) * (i % 2 == 0 ? 1 : -1);
        if (r == 0) {
          want = value(0, i) * (i % 2 == 0 ? 1 : -1);
          for (int q = 1; q < world; ++q)
            want = std::max(want, value(q, i) * (i % 2 == 0 ? 1 : -1));
        }
        wrong += one[i] != want;
      }
      EXPECT_EQ(wrong, 0u) << "reduce, rank " << r;
      g.barrier();
    });
  }
}

// Each op's single-copy path ran (its debug lines: one per rank and peer it read from), in a
// process of its own whose logger starts at debug (as OneRankOutside... below).
// Runs every_collective at world 2 and 3 and counts each op's single-copy lines: 0 if they are
// as expected (saying what they were on stderr either way).
int every_collective_lines() {
  ::testing::internal::CaptureStderr();
  every_collective(2);
  every_collective(3);
  const std::string log = ::testing::internal::GetCapturedStderr();
  std::map<std::string, int> lines;
  const std::regex line("shm: ([a-z_]+) #[0-9]+ of rank [0-9]+: single copy");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    ++lines[(*it)[1]];
  }
  // World 2 and 3: allgather, reduce_scatter, reduce W (W - 1); broadcast W - 1.
  const std::map<std::string, int> want = {
      {"allgather", 2 + 6}, {"reduce_scatter", 2 + 6}, {"broadcast", 1 + 2}, {"reduce", 2 + 6}};
  for (const auto& [op, count] : lines) {
    std::fprintf(stderr, "%s: %d single-copy lines (expected %d)\n", op.c_str(), count,
                 want.count(op) ? want.at(op) : 0);
  }
  return lines == want && !::testing::Test::HasFailure() ? 0 : 1;
}

TEST(Symmetric, EveryCollectiveTakesItsSingleCopyPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ::setenv("TUTTI_LOG_LEVEL", "debug", 1);
  EXPECT_EXIT(std::exit(every_collective_lines()), ::testing::ExitedWithCode(0), "");
}

// Three ranks allreduce 100003 floats three times, from symmetric memory but for rank
// `outside` (-1: none), which uses a vector of its own. Returns how many debug lines said
// "single copy" (one per rank and peer read from), or -1 (saying why on stderr) if a result was
// wrong.
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
  for (size_t at = log.find("single copy"); at != std::string::npos;
       at = log.find("single copy", at + 1)) {
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
          const int want = outside < 0 ? 3 * 2 * 3 : 0;  // ranks x peers x reps
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

// Names go at once; a region one rank drops stays mapped by the others (an op on another region
// goes on), and once every rank dropped it, the next allocation unmaps it everywhere.
TEST(Symmetric, NothingIsLeftInDevShmAndADroppedRegionIsUnmappedEverywhere) {
  auto groups = create_groups(2, "shm", unique_name("sym-files"), milliseconds(20000));
  const int before = symmetric_mappings();
  run_ranks(2, [&](int r) {
    auto& g = *groups[r];
    auto a = g.allocate_symmetric(1 << 20);
    auto b = g.allocate_symmetric(100);
    EXPECT_TRUE(a->symmetric() && b->symmetric());
    EXPECT_EQ(b->size(), 100u);
    // is_symmetric: within one allocation of this group's, and nowhere else.
    auto* a0 = static_cast<char*>(a->data());
    EXPECT_TRUE(g.is_symmetric(a0, 1 << 20));
    EXPECT_TRUE(g.is_symmetric(a->view(DType::kFloat32, {10}, 4096)));
    EXPECT_TRUE(g.is_symmetric(b->data(), 100));
    EXPECT_FALSE(g.is_symmetric(a0, (1 << 20) + 1));
    EXPECT_FALSE(g.is_symmetric(a0 + (1 << 20) - 3, 4));
    EXPECT_FALSE(g.is_symmetric(a0 - 1, 2));
    EXPECT_FALSE(g.is_symmetric(static_cast<char*>(b->data()) + 96, 8));
    std::vector<float> ordinary(16);
    EXPECT_FALSE(g.is_symmetric(TensorView(ordinary.data(), DType::kFloat32, {16})));
    const void* b_data = b->data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    const auto* z = static_cast<const unsigned char*>(a->data());
    EXPECT_TRUE(std::all_of(z, z + a->size(), [](unsigned char c) { return c == 0; }));
    g.barrier();
    if (r == 0) EXPECT_EQ(symmetric_mappings() - before, 8);  // 2 regions x 2 ranks x 2 maps
    g.barrier();
    if (r == 1) b.reset();  // rank 0 still maps rank 1's part
    std::vector<float> expect(262144);
    float* v = static_cast<float*>(a->data());
    for (size_t i = 0; i < expect.size(); ++i) {
      v[i] = static_cast<float>(input(r, i));
      expect[i] = reduced<float>(ReduceOp::kSum, 2, i);
    }
    g.allreduce(TensorView(v, DType::kFloat32, {262144}));
    EXPECT_EQ(std::memcmp(v, expect.data(), expect.size() * sizeof(float)), 0);
    if (r == 0) EXPECT_EQ(symmetric_mappings() - before, 7);  // rank 1's own map of b went
    b.reset();
    EXPECT_FALSE(g.is_symmetric(b_data, 1));  // freed
    g.barrier();
    auto c = g.allocate_symmetric(4096);  // drops the peers' maps of b on both ranks
    g.barrier();
    if (r == 0) EXPECT_EQ(symmetric_mappings() - before, 8);  // a and c
    g.barrier();
  });
  // Every rank dropped a and c: the peers' maps of them wait for the next allocation, or the
  // group's end.
  EXPECT_EQ(symmetric_mappings() - before, 4);
  EXPECT_EQ(joined(symmetric_files()), "");
  for (auto& g : groups) g->destroy();
  EXPECT_EQ(symmetric_mappings() - before, 0);
  EXPECT_EQ(joined(symmetric_files()), "");
}

// An aborted group refuses a new allocation before it touches its regions: the peers' maps of a
// region both ranks dropped stay until the group's end (an op the abort left queued may still
// copy from them), where the allocation's prune used to unmap them.
TEST(Symmetric, AnAbortedGroupRefusesAnAllocationAndUnmapsNothing) {
  auto groups = create_groups(2, "shm", unique_name("sym-abort"), milliseconds(20000));
  const int before = symmetric_mappings();
  run_ranks(2, [&](int r) {
    auto a = groups[r]->allocate_symmetric(4096);
    groups[r]->barrier();
    a.reset();
  });
  EXPECT_EQ(symmetric_mappings() - before, 2);  // each rank's map of the other's part
  for (auto& g : groups) g->abort("the test aborts it");
  for (auto& g : groups) {
    EXPECT_TUTTI_ERROR(g->allocate_symmetric(4096), ErrorCode::kAborted, "allocate_symmetric",
                       "the test aborts it");
  }
  EXPECT_EQ(symmetric_mappings() - before, 2);
  for (auto& g : groups) g->destroy();
  EXPECT_EQ(symmetric_mappings() - before, 0);
}

// Ranks that ask for different sizes all fail, naming both, and the group goes on.
TEST(Symmetric, DifferentSizesFailOnEveryRankAndTheGroupGoesOn) {
  auto groups = create_groups(3, "shm", unique_name("sym-sizes"), milliseconds(5000));
  run_ranks(3, [&](int r) {
    EXPECT_TUTTI_ERROR(
        groups[r]->allocate_symmetric(r == 1 ? 8192 : 4096), ErrorCode::kInvalidArgument,
        "allocate_symmetric on group",
        r == 1 ? "rank 0 asked for 4096 bytes, rank 1 for 8192" : "rank 1 asked for 8192 bytes");
    std::vector<int32_t> v(10, r);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[9], 3);
    // A size no rank may have, asked for by one rank: every rank fails at once, naming it
    // (before, the others waited in the exchange until their 5 s timeout); by all: each fails.
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TUTTI_ERROR(
        groups[r]->allocate_symmetric(r == 2 ? 0 : 4096), ErrorCode::kInvalidArgument,
        r == 2 ? "rank 0 asked for 4096 bytes, rank 2 for 0"
               : "rank 2 asked for 0 bytes, rank " + std::to_string(r) + " for 4096");
    EXPECT_TUTTI_ERROR(groups[r]->allocate_symmetric(0), ErrorCode::kInvalidArgument, "bytes is 0");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    groups[r]->allreduce(v);
    EXPECT_EQ(v[9], 9);
  });
  EXPECT_EQ(joined(symmetric_files()), "");
}

// Many chunks (4 KiB ones), 3 or 4 ranks, values whose sums round: the single-copy path gives
// the staged path's bits, and so does every op with one rank outside (its extra barrier met in
// the first chunk of many): allreduce sum, reduce avg to rank 1 (whose non-roots keep their
// tensors), reduce_scatter avg, allgather. With 3 ranks a reduce's chunk is 1023 floats (3
// slices of 341), not the 1024 a staging half holds: both paths must chunk alike.
void same_bits_over_many_chunks(int world) {
  ::setenv("TUTTI_SHM_CHUNK_BYTES", "4096", 1);  // read as the groups are made
  const size_t n = 40000;                        // floats per rank: 160 KB, 40 chunks
  auto groups = create_groups(world, "shm", unique_name("sym-bits"), milliseconds(20000));
  ::unsetenv("TUTTI_SHM_CHUNK_BYTES");
  auto value = [](int r, size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * 1000.0 + r * 1e-3);
  };
  run_ranks(world, [&](int r) {
    auto& g = *groups[r];
    auto mem = g.allocate_symmetric(2 * world * n * sizeof(float));
    ASSERT_TRUE(mem->symmetric());
    float* sym = static_cast<float*>(mem->data());
    // One op three ways: every rank's memory in plain vectors (the staged path), every rank's in
    // symmetric memory, and rank 2's alone outside. Returns the three results.
    auto three_ways = [&](size_t elements, const std::function<void(float*)>& fill,
                          const std::function<void(float*)>& run) {
      std::vector<std::vector<float>> out;
      for (int way = 0; way < 3; ++way) {
        std::vector<float> plain(elements);
        float* mine = way == 0 || (way == 2 && r == 2) ? plain.data() : sym;
        fill(mine);
        run(mine);
        out.emplace_back(mine, mine + elements);
        g.barrier();
      }
      return out;
    };
    auto same_bits = [&](const std::vector<std::vector<float>>& got, const char* what) {
      EXPECT_EQ(std::memcmp(got[1].data(), got[0].data(), got[0].size() * sizeof(float)), 0)
          << what << ", all in symmetric memory, rank " << r;
      EXPECT_EQ(std::memcmp(got[2].data(), got[0].data(), got[0].size() * sizeof(float)), 0)
          << what << ", rank 2 outside, rank " << r;
    };
    auto fill_n = [&](float* p) {
      for (size_t i = 0; i < n; ++i) p[i] = value(r, i);
    };
    auto sum = three_ways(n, fill_n, [&](float* p) {
      g.allreduce(TensorView(p, DType::kFloat32, {static_cast<int64_t>(n)}));
    });
    same_bits(sum, "allreduce");
    // Element 20120 by hand, in the staged path's order for its owner (rank 2 at 3 ranks, where
    // chunks of 1024 floats would have made it rank 1's, and its sum another float).
    float want = 0;
    {
      // W slices of 4096 / 4 / W floats make a chunk; slice q of a chunk is rank q's.
      const size_t slice = 4096 / sizeof(float) / world, chunk = slice * world;
      const size_t i = 20120, first = i / chunk * chunk;
      const size_t at = i - first;
      int owner = 0;
      while (at >= chunk * static_cast<size_t>(owner + 1) / world) ++owner;
      want = value(owner, i);
      for (int q = 0; q < world; ++q) {
        if (q != owner) want += value(q, i);
      }
    }
    EXPECT_EQ(sum[0][20120], want) << "rank " << r;
    auto avg = three_ways(n, fill_n, [&](float* p) {
      ReduceOptions o;
      o.root_rank = 1;
      o.reduce_op = ReduceOp::kAvg;
      g.reduce(TensorView(p, DType::kFloat32, {static_cast<int64_t>(n)}), o);
    });
    same_bits(avg, "reduce avg");
    if (r != 1) EXPECT_EQ(avg[1][777], value(r, 777)) << "a non-root's tensor was written";
    auto rs = three_ways(
        world * n,
        [&](float* p) {
          for (size_t i = 0; i < world * n; ++i) p[i] = value(r, i);
        },
        [&](float* p) {
          ReduceScatterOptions o;
          o.reduce_op = ReduceOp::kAvg;
          std::vector<float> out(n);
          g.reduce_scatter(TensorView(out),
                           TensorView(p, DType::kFloat32, {static_cast<int64_t>(world * n)}), o);
          std::memcpy(p, out.data(), n * sizeof(float));
        });
    for (auto& v : rs) v.resize(n);
    same_bits(rs, "reduce_scatter avg");
    auto ag = three_ways(n + world * n, fill_n, [&](float* p) {
      g.allgather(TensorView(p + n, DType::kFloat32, {static_cast<int64_t>(world * n)}),
                  TensorView(p, DType::kFloat32, {static_cast<int64_t>(n)}));
    });
    same_bits(ag, "allgather");
    EXPECT_EQ(ag[1][n + 2 * n + 5], value(2, 5));
  });
}

TEST(Symmetric, TheSameBitsAsTheStagedPathOverManyChunks) {
  same_bits_over_many_chunks(4);
}
TEST(Symmetric, TheSameBitsAsTheStagedPathOverManyChunksOfThreeSlices) {
  same_bits_over_many_chunks(3);
}

TEST(Symmetric, ViewsAreChecked) {
  auto groups = create_groups(1, "shm", unique_name("sym-view"));
  auto mem = groups[0]->allocate_symmetric(4096);
  EXPECT_EQ(mem->view(DType::kFloat32, {1024}).numel(), 1024);
  EXPECT_EQ(mem->view(DType::kFloat64, {2, 255}, 16).data(), static_cast<char*>(mem->data()) + 16);
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
  // Sizes past any address space are refused: they wrapped the roundings to a page or a cache
  // line, and came back as a page that claimed SIZE_MAX bytes.
  for (size_t huge : {SIZE_MAX, SIZE_MAX - 8, (size_t{1} << 46) + 1}) {
    EXPECT_TUTTI_ERROR(groups[0]->allocate_symmetric(huge), ErrorCode::kInvalidArgument,
                       std::to_string(huge) + " bytes is more than a process can map");
  }
  groups[0]->destroy();
  EXPECT_TUTTI_ERROR(groups[0]->allocate_symmetric(64), ErrorCode::kInvalidUsage, "destroyed");
}

// A backend without symmetric memory hands out ordinary memory; ops on it work as on any.
TEST(Symmetric, GlooHandsOutOrdinaryMemory) {
  auto groups = create_groups(2, "gloo", unique_name("sym-gloo"), milliseconds(20000));
  run_ranks(2, [&](int r) {
    auto mem = groups[r]->allocate_symmetric(4000);
    EXPECT_FALSE(mem->symmetric());
    EXPECT_FALSE(groups[r]->is_symmetric(mem->data(), 4000));
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
      EXPECT_TUTTI_ERROR(groups[1]->allreduce(v), ErrorCode::kRemoteError,
                         "rank 0 called allgather");
    }
  });
  EXPECT_EQ(joined(symmetric_files()), "");
}

}  // namespace
}  // namespace tutti::testing
