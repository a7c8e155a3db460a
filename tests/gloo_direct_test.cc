// The Gloo backend's own allreduces over the sockets of a second context (the direct exchange for
// small and mid-size allreduces and barriers, the ring for large ones): sizes and block shapes,
// results identical on every rank, mismatched calls failing with the peer named, a silent peer
// timing out, and the switches that choose. Ranks as threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "sanitizers.h"
#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

constexpr size_t k32K = 32 << 10;

// Gloo groups of `world` ranks made with `variable` set to `value` (the backend reads it when
// the group is made).
std::vector<std::shared_ptr<CollectiveGroup>> groups_with(
    const char* variable, const char* value, int world, const std::string& name,
    milliseconds timeout = milliseconds(30000)) {
  ::setenv(variable, value, 1);
  auto groups = create_groups(world, "gloo", name, timeout);
  ::unsetenv(variable);
  return groups;
}

// What init says on each of `world` ranks with `variable` set to `value`.
std::vector<std::string> init_errors_with(const char* variable, const char* value, int world = 2) {
  ::setenv(variable, value, 1);
  auto store = std::make_shared<HashStore>(milliseconds(5000));
  const std::string name = unique_name("direct-bad-setting");
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int r) {
    GroupOptions options;
    options.store = store;
    options.timeout = milliseconds(5000);
    try {
      CollectiveGroup::create(world, r, "gloo", name, options);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  ::unsetenv(variable);
  return errors;
}

// Rank r's element i of a float sum whose rounding depends on the order of its terms: 1e8, a small
// number and -1e8, in an order that rotates with i.
float order_sensitive_value(int r, int64_t i) {
  const float parts[3] = {1.0e8f, 3.0f + static_cast<float>(i % 7), -1.0e8f};
  return parts[(r + i) % 3];
}

// Every rank's result of allreducing n such elements over `groups` (3 ranks).
std::vector<std::vector<float>> order_sensitive_sums(
    const std::vector<std::shared_ptr<CollectiveGroup>>& groups, int64_t n) {
  const int world = static_cast<int>(groups.size());
  std::vector<std::vector<float>> out(world);
  run_ranks(world, [&](int r) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = order_sensitive_value(r, i);
    groups[r]->allreduce(v);
    out[r] = v;
  });
  return out;
}

// Sizes around 32 KiB and past a socket's initial 64 KiB window, in int32 elements, at 2 and 3
// ranks, through the direct exchange (TUTTI_GLOO_ALLREDUCE=direct): rank r contributes
// r * 1000 + i at element i.
TEST(GlooDirect, AllreduceAcrossWindowSizes) {
  for (int world : {2, 3}) {
    auto groups =
        groups_with("TUTTI_GLOO_ALLREDUCE", "direct", world, unique_name("direct-chunks"));
    const int64_t counts[] = {1, k32K / 4 - 1, k32K / 4, k32K / 4 + 1, 3 * k32K / 4 + 5};
    run_ranks(world, [&](int r) {
      for (int64_t n : counts) {
        std::vector<int32_t> v(n);
        for (int64_t i = 0; i < n; ++i) v[i] = r * 1000 + static_cast<int32_t>(i);
        groups[r]->allreduce(v);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          // sum over ranks of (rank * 1000 + i)
          const int64_t want = 1000LL * world * (world - 1) / 2 + world * i;
          wrong += v[i] != want;
        }
        EXPECT_EQ(wrong, 0) << "world " << world << ", " << n << " elements, rank " << r;
      }
    });
  }
}

// Float sums whose rounding depends on the order: every rank must still end with the same
// bits, namely those of summing in rank order (the order the backend documents).
TEST(GlooDirect, EveryRankGetsTheSameBits) {
  const int world = 3;
  auto groups = create_groups(world, "gloo", unique_name("direct-bits"));
  const int64_t n = 5000;
  const auto out = order_sensitive_sums(groups, n);
  for (int64_t i = 0; i < n; ++i) {
    float want = order_sensitive_value(0, i);
    for (int r = 1; r < world; ++r) want = want + order_sensitive_value(r, i);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(std::memcmp(&out[r][i], &want, sizeof(float)), 0)
          << "element " << i << " on rank " << r << ": " << out[r][i] << ", want " << want;
    }
  }
}

// Two small allreduces of different sizes meet in the direct exchange: each rank's header
// check names the other rank, and the group is aborted.
TEST(GlooDirect, MismatchedSizesFailNamingThePeer) {
  auto groups = create_groups(2, "gloo", unique_name("direct-mismatch"), milliseconds(20000));
  run_ranks(2, [&](int r) {
    std::vector<float> v(r == 0 ? 8 : 9, 1.0f);
    const std::string peer = "rank " + std::to_string(1 - r) + " called a different op or size";
    EXPECT_TUTTI_ERROR(groups[r]->allreduce(v), ErrorCode::kRemoteError, "allreduce #0", peer,
                       "same calls in the same order");
    EXPECT_TRUE(groups[r]->is_aborted());
  });
}

TEST(GlooDirect, ASilentPeerTimesOutNamingIt) {
  auto groups = create_groups(2, "gloo", unique_name("direct-silent"), milliseconds(400));
  std::vector<float> v(4, 1.0f);
  EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kTimeout, "allreduce #0",
                     "timed out after 400 ms", "waiting for rank 1");
  EXPECT_TUTTI_ERROR(groups[0]->barrier(), ErrorCode::kAborted);
}

// Through Gloo's own pairs (TUTTI_GLOO_ALLREDUCE=gloo), a ring reduce_scatter where rank 2 never
// calls: rank 1 gets its left neighbour's block and then waits to send to rank 2; rank 0 waits
// for rank 2's block. Both time out naming rank 2, the neighbour each was waiting for.
TEST(GlooDirect, GloosRingReduceScatterNamesTheNeighbourItWaitsFor) {
  auto groups =
      groups_with("TUTTI_GLOO_ALLREDUCE", "gloo", 3, unique_name("ring-blame"), milliseconds(600));
  run_ranks(2, [&](int r) {
    std::vector<float> in(3 * 1024, 1.0f), out(1024);
    EXPECT_TUTTI_ERROR(groups[r]->reduce_scatter(TensorView(out), TensorView(in)),
                       ErrorCode::kTimeout, "reduce_scatter #0", "timed out after 600 ms",
                       "waiting for rank 2");
  });
}

TEST(GlooDirect, BarrierThenAllreduceStayInStep) {
  auto groups = create_groups(4, "gloo", unique_name("direct-barrier"));
  run_ranks(4, [&](int r) {
    for (int k = 0; k < 20; ++k) {
      groups[r]->barrier();
      std::vector<int64_t> v(3, r + k);
      groups[r]->allreduce(v);
      EXPECT_EQ(v[2], 0 + 1 + 2 + 3 + 4 * k);
    }
  });
}

// TUTTI_GLOO_ALLREDUCE=gloo sends every allreduce and barrier through Gloo's own functions; the
// results are the same.
TEST(GlooDirect, GlooByEnvironmentGivesTheSameResults) {
  auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "gloo", 3, unique_name("direct-off"));
  run_ranks(3, [&](int r) {
    groups[r]->barrier();
    std::vector<int32_t> v(1000, r + 1);
    groups[r]->allreduce(v);
    EXPECT_EQ(v[999], 6);
  });
}

// The ring (TUTTI_GLOO_ALLREDUCE=ring takes it at every size): counts smaller than, equal to and
// just past the number of ranks (empty blocks, uneven blocks), and counts whose blocks cross the
// staging buffer's size unevenly, in 1-, 4- and 8-byte elements, at 2, 3 and 4 ranks. Rank r
// contributes r * 7 + i (mod the type) at element i.
TEST(GlooRing, AllreduceOfEverySizeAndBlockShape) {
  constexpr int64_t kStaging = 256 << 10;  // DirectExchange::kStagingBytes, restated
  for (int world : {2, 3, 4}) {
    auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "ring", world, unique_name("ring-sizes"));
    const int64_t counts[] = {1,
                              world - 1,
                              world,
                              world + 1,
                              1000,
                              kStaging / 4 * world + 3,
                              3 * kStaging / 8 * world - 5};
    run_ranks(world, [&](int r) {
      for (int64_t n : counts) {
        std::vector<int32_t> a(n);
        std::vector<int64_t> b(n);
        std::vector<uint8_t> c(n);
        for (int64_t i = 0; i < n; ++i) {
          a[i] = r * 7 + static_cast<int32_t>(i);
          b[i] = (int64_t{1} << 40) * r + i;
          c[i] = static_cast<uint8_t>(r * 7 + i);
        }
        groups[r]->allreduce(a);
        groups[r]->allreduce(b);
        groups[r]->allreduce(c);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t sum_r = int64_t{world} * (world - 1) / 2;  // 0 + 1 + ... + (world - 1)
          wrong += a[i] != static_cast<int32_t>(7 * sum_r + world * i);
          wrong += b[i] != (int64_t{1} << 40) * sum_r + world * i;
          wrong += c[i] != static_cast<uint8_t>(7 * sum_r + world * i);
        }
        EXPECT_EQ(wrong, 0) << "world " << world << ", " << n << " elements, rank " << r;
      }
    });
  }
}

// Float sums whose rounding depends on the order, through the ring: every rank ends with the same
// bits (each block is reduced once, on its way around the ring), and within rounding of the sum.
TEST(GlooRing, EveryRankGetsTheSameBits) {
  const int world = 3;
  auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "ring", world, unique_name("ring-bits"));
  const int64_t n = 200000;
  const auto out = order_sensitive_sums(groups, n);
  for (int64_t i = 0; i < n; ++i) {
    for (int r = 1; r < world; ++r) {
      ASSERT_EQ(std::memcmp(&out[r][i], &out[0][i], sizeof(float)), 0)
          << "element " << i << ": rank " << r << " has " << out[r][i] << ", rank 0 " << out[0][i];
    }
    // 1e8 + x - 1e8 in float: x rounded to a multiple of 8, or exact when added last.
    const float x = 3.0f + static_cast<float>(i % 7);
    ASSERT_LE(std::fabs(out[0][i] - x), 8.0f) << "element " << i;
  }
}

// Recursive doubling at 4 and 8 ranks (forced at every size): integer sums exact across sizes,
// and order-sensitive float sums bit-identical on every rank.
TEST(GlooDoubling, SumsAndBitsAtFourAndEightRanks) {
  for (int world : {4, 8}) {
    auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "doubling", world, unique_name("doubling"));
    std::vector<std::vector<float>> floats(world);
    run_ranks(world, [&](int r) {
      for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300000}}) {
        std::vector<int64_t> v(n);
        for (int64_t i = 0; i < n; ++i) v[i] = (int64_t{1} << 33) * r + i;
        groups[r]->allreduce(v);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          wrong += v[i] != (int64_t{1} << 33) * (world * (world - 1) / 2) + world * i;
        }
        EXPECT_EQ(wrong, 0) << "world " << world << ", " << n << " elements, rank " << r;
      }
      std::vector<float> f(4096);
      for (size_t i = 0; i < f.size(); ++i) {
        f[i] = (r + i) % 3 == 0 ? 1.0e8f : (r + i) % 3 == 1 ? -1.0e8f : 0.5f + r;
      }
      groups[r]->allreduce(f);
      floats[r] = f;
    });
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(std::memcmp(floats[r].data(), floats[0].data(), floats[0].size() * sizeof(float)),
                0)
          << "world " << world << ": rank " << r << "'s bits differ from rank 0's";
    }
  }
}

// Min over +0 and -0, whose result depends on the order of its operands (min(+0, -0) is +0,
// min(-0, +0) is -0): every rank must still hold the same bits, which holds only if both partners
// of each step put the lower group's value first.
TEST(GlooDoubling, OperandOrderIsTheSameOnBothPartners) {
  const int world = 4;
  auto groups =
      groups_with("TUTTI_GLOO_ALLREDUCE", "doubling", world, unique_name("doubling-order"));
  std::vector<std::vector<float>> out(world);
  run_ranks(world, [&](int r) {
    std::vector<float> v(64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = ((r + (i >> 2)) & 1) != 0 ? -0.0f : 0.0f;
    AllreduceOptions o;
    o.reduce_op = ReduceOp::kMin;
    groups[r]->allreduce(v, o);
    out[r] = v;
  });
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)), 0)
        << "rank " << r << "'s bits differ from rank 0's";
  }
}

TEST(GlooDoubling, ANonPowerOfTwoWorldIsRefusedAtInit) {
  const auto errors = init_errors_with("TUTTI_GLOO_ALLREDUCE", "doubling", 3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("TUTTI_GLOO_ALLREDUCE=doubling needs a power of two ranks, not 3"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

// A large allreduce takes the ring on its own (past the direct exchange's limit), mixed with
// barriers and small ones: the sums are right and the streams stay in step.
TEST(GlooRing, LargeAndSmallAllreducesInTurn) {
  const int world = 4;
  auto groups = create_groups(world, "gloo", unique_name("ring-mixed"));
  run_ranks(world, [&](int r) {
    for (int k = 0; k < 3; ++k) {
      std::vector<float> big((size_t{3} << 20) / 4 + 1, static_cast<float>(r + k));
      groups[r]->allreduce(big);
      std::vector<int64_t> small(5, r);
      groups[r]->allreduce(small);
      groups[r]->barrier();
      const float want = static_cast<float>(0 + 1 + 2 + 3 + 4 * k);
      EXPECT_EQ(big.front(), want);
      EXPECT_EQ(big[big.size() / 2], want);
      EXPECT_EQ(big.back(), want);
      EXPECT_EQ(small[4], 6);
    }
  });
}

// Ranks that make different calls meet in the ring: the header check names the peer.
TEST(GlooRing, MismatchedSizesFailNamingThePeer) {
  auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "ring", 3, unique_name("ring-mismatch"),
                            milliseconds(20000));
  run_ranks(3, [&](int r) {
    // Rank 1 calls with another size: its right neighbour (2) and itself see the difference.
    std::vector<float> v(r == 1 ? 90000 : 100000, 1.0f);
    try {
      groups[r]->allreduce(v);
      ADD_FAILURE() << "rank " << r << ": the allreduce returned";
    } catch (const Error& e) {
      const std::string what = e.what();
      if (r == 1 || r == 2) {
        const int left = (r + 2) % 3;
        EXPECT_EQ(e.code(), ErrorCode::kRemoteError) << what;
        EXPECT_NE(what.find("rank " + std::to_string(left) + " called a different op or size"),
                  std::string::npos)
            << what;
      }
    }
    EXPECT_TRUE(groups[r]->is_aborted()) << "rank " << r;
  });
}

TEST(GlooRing, ASilentPeerTimesOutNamingIt) {
  auto groups =
      groups_with("TUTTI_GLOO_ALLREDUCE", "ring", 3, unique_name("ring-silent"), milliseconds(400));
  std::vector<float> v(300000, 1.0f);
  // Rank 0 receives from rank 2 (its left), which never calls.
  run_ranks(2, [&](int r) {
    if (r == 0) {
      EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kTimeout, "allreduce #0",
                         "timed out after 400 ms", "waiting for rank 2");
    } else {
      std::vector<float> w(300000, 1.0f);
      EXPECT_THROW(groups[1]->allreduce(w), Error);
    }
  });
}

// 1-byte elements whose blocks fill the 256 KiB staging buffer more than once, at 2 and 3 ranks.
TEST(GlooRing, SmallElementsRefillTheStagingBuffer) {
  for (int world : {2, 3}) {
    auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "ring", world, unique_name("ring-bytes"));
    const int64_t n = int64_t{world} * (600 << 10) + 7;
    run_ranks(world, [&](int r) {
      std::vector<uint8_t> c(n);
      for (int64_t i = 0; i < n; ++i) c[i] = static_cast<uint8_t>(r * 3 + i);
      groups[r]->allreduce(c);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        wrong += c[i] != static_cast<uint8_t>(3 * world * (world - 1) / 2 + world * i);
      }
      EXPECT_EQ(wrong, 0) << "world " << world << ", rank " << r;
    });
  }
}

// abort() from another thread ends a ring allreduce that waits in poll() for a peer that never
// calls, at once.
TEST(GlooRing, AbortFromAnotherThreadEndsAWaitingRing) {
  auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "ring", 2, unique_name("ring-abort"),
                            milliseconds(30000));
  std::vector<float> v(1 << 20, 1.0f);
  double ended_ms = 0;
  std::thread op([&] {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TUTTI_ERROR(groups[0]->allreduce(v), ErrorCode::kAborted, "allreduce #0", "stop");
    ended_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  });
  std::this_thread::sleep_for(milliseconds(300));
  groups[0]->abort("stop");
  op.join();
  EXPECT_LT(ended_ms, 300 + 2000);
}

// The direct exchange forced at sizes far past the sockets' buffers, at 3 ranks: every rank
// writes 32 MiB to each peer while reading theirs, which blocking writes would deadlock.
TEST(GlooDirect, MessagesLargerThanTheSocketBuffersDoNotDeadlock) {
  auto groups = groups_with("TUTTI_GLOO_ALLREDUCE", "direct", 3, unique_name("direct-large"),
                            milliseconds(60000));
  run_ranks(3, [&](int r) {
    std::vector<int32_t> v((size_t{32} << 20) / 4, r + 1);
    v.back() = 10 * r;
    groups[r]->allreduce(v);
    EXPECT_EQ(v.front(), 1 + 2 + 3);
    EXPECT_EQ(v[v.size() / 2], 1 + 2 + 3);
    EXPECT_EQ(v.back(), 0 + 10 + 20);
  });
}

TEST(GlooDirect, BadSettingsAreRefusedNamingThem) {
  const struct {
    const char* variable;
    const char* value;
    const char* message;
  } cases[] = {
      {"TUTTI_GLOO_ALLREDUCE", "fastest",
       "TUTTI_GLOO_ALLREDUCE must be auto, direct, doubling, ring or gloo, not 'fastest'"},
      {"TUTTI_GLOO_DIRECT_BYTES", "lots",
       "TUTTI_GLOO_DIRECT_BYTES must be a byte count, not 'lots'"},
      {"TUTTI_GLOO_SNDBUF", "big", "TUTTI_GLOO_SNDBUF must be a byte count, not 'big'"},
      {"TUTTI_GLOO_KEEP_BYTES", "1G", "TUTTI_GLOO_KEEP_BYTES must be a byte count, not '1G'"},
  };
  for (const auto& c : cases) {
    const auto errors = init_errors_with(c.variable, c.value);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find(c.message), std::string::npos) << "rank " << r << ": " << errors[r];
    }
  }
}

// Send buffers chosen by hand (1 page, and the kernel's autotuning for a same-host peer) change
// the speed, never the sums.
TEST(GlooDirect, AnySendBufferGivesTheSameSums) {
  for (const char* bytes : {"4096", "0"}) {
    auto groups = groups_with("TUTTI_GLOO_SNDBUF", bytes, 3, unique_name("direct-sndbuf"));
    run_ranks(3, [&](int r) {
      for (size_t n : {size_t{10}, size_t{1} << 18}) {
        std::vector<int32_t> v(n, r + 1);
        groups[r]->allreduce(v);
        EXPECT_EQ(v.front(), 6) << "TUTTI_GLOO_SNDBUF=" << bytes << ", " << n << " elements";
        EXPECT_EQ(v.back(), 6) << "TUTTI_GLOO_SNDBUF=" << bytes << ", " << n << " elements";
      }
    });
  }
}

// How much this process's resident memory grew, MiB, over `op` on each rank of `groups` (2
// ranks, 64 MiB of floats each: rank r's are r + 1), and the first rank's first and last element.
struct Grown {
  double mib = 0;
  float first = 0, last = 0;
};
Grown grown_over(const std::vector<std::shared_ptr<CollectiveGroup>>& groups,
                 const std::function<CollectiveGroup::WorkPtr(CollectiveGroup&, TensorView)>& op) {
  constexpr int64_t n = 16 << 20;  // floats: 64 MiB, above malloc's largest mmap threshold
  std::vector<std::vector<float>> v(2);
  for (int r = 0; r < 2; ++r) v[r].assign(n, static_cast<float>(r + 1));
  const size_t before = rss_bytes();
  run_ranks(2, [&](int r) {
    if (CollectiveGroup::WorkPtr w = op(*groups[r], TensorView(v[r]))) w->wait();
  });
  Grown g;
  g.mib = (static_cast<double>(rss_bytes()) - static_cast<double>(before)) / (1 << 20);
  g.first = v[0][0];
  g.last = v[0][n - 1];
  return g;
}

// The direct exchange's receive buffers are kept for the next op up to TUTTI_GLOO_KEEP_BYTES in
// all (default 256 MiB), else freed after their op: a 64 MiB reduce at 2 ranks leaves the root's
// 64 MiB inbox resident by default, and none of it with the bound at 1 MiB; nor does a 64 MiB
// allreduce by the direct exchange (TUTTI_GLOO_ALLREDUCE=direct takes any size: 2 x 64 MiB).
TEST(GlooDirect, ReceiveBuffersAreKeptUpToTheirBound) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer's quarantine keeps freed memory resident (LeakSanitizer "
                    "checks that nothing leaks there)";
  }
  auto reduce = [](CollectiveGroup& g, TensorView t) {
    ReduceOptions o;
    o.root_rank = 0;
    return g.reduce(t, o);
  };
  for (const char* keep : {"", "1048576"}) {
    const Grown g = grown_over(
        groups_with("TUTTI_GLOO_KEEP_BYTES", keep, 2, unique_name("direct-keep")), reduce);
    EXPECT_EQ(g.first, 3.0f);
    EXPECT_EQ(g.last, 3.0f);
    if (*keep == '\0') {
      EXPECT_GT(g.mib, 48.0) << "the root's 64 MiB inbox was not kept";
    } else {
      EXPECT_LT(g.mib, 16.0) << "the root's 64 MiB inbox was kept past a 1 MiB bound";
    }
  }
  ::setenv("TUTTI_GLOO_ALLREDUCE", "direct", 1);
  auto groups = groups_with("TUTTI_GLOO_KEEP_BYTES", "1048576", 2, unique_name("direct-keep"));
  ::unsetenv("TUTTI_GLOO_ALLREDUCE");
  const Grown g =
      grown_over(groups, [](CollectiveGroup& c, TensorView t) { return c.allreduce(t); });
  EXPECT_EQ(g.first, 3.0f);
  EXPECT_EQ(g.last, 3.0f);
  EXPECT_LT(g.mib, 16.0) << "a direct allreduce's 2 x 64 MiB inboxes were kept past a 1 MiB bound";
}

}  // namespace
}  // namespace tutti::testing
