// The backend registry. This binary names no symbol of tutti::gloo: "gloo" must be registered
// by linking the target alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "test_util.h"

namespace tutti::testing {
namespace {

class NullBackend : public Backend {
 public:
  const char* name() const override { return "null"; }
  bool supports(OpType op) const override { return op == OpType::kBarrier; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }
  WorkPtr barrier(const BarrierOptions&, const OpContext&) override { return nullptr; }
  void abort(const std::string&) override {}
};

TEST(Registry, GlooIsRegisteredByLinking) {
  EXPECT_TRUE(is_registered_collective_backend("gloo"));
  EXPECT_TRUE(is_registered_collective_backend("GLOO"));
  EXPECT_TRUE(is_backend_available("Gloo"));
}

TEST(Registry, UnknownNamesAnswerFalse) {
  EXPECT_FALSE(is_registered_collective_backend("no-such-backend"));
  EXPECT_FALSE(is_backend_available("no-such-backend"));
  EXPECT_TUTTI_ERROR(CollectiveGroup::create(1, 0, "no-such-backend", "g"), ErrorCode::kUnavailable,
                     "'no-such-backend' is not registered", "gloo");
}

TEST(Registry, DuplicatesAreRefusedCaseInsensitively) {
  auto factory = [](const BackendContext&) { return std::make_unique<NullBackend>(); };
  register_collective_backend("Null-Test", factory);
  EXPECT_TRUE(is_registered_collective_backend("null-test"));
  EXPECT_TUTTI_ERROR(register_collective_backend("NULL-TEST", factory), ErrorCode::kInvalidUsage,
                     "already registered");
  EXPECT_TUTTI_ERROR(register_collective_backend("", factory), ErrorCode::kInvalidArgument,
                     "empty");
}

TEST(Registry, AvailabilityIsAskedOfTheBackend) {
  register_collective_backend(
      "never-here", [](const BackendContext&) { return std::make_unique<NullBackend>(); },
      [] { return false; });
  EXPECT_TRUE(is_registered_collective_backend("never-here"));
  EXPECT_FALSE(is_backend_available("never-here"));
}

TEST(Registry, UnsupportedOpsFailBeforeIO) {
  register_collective_backend(
      "barrier-only", [](const BackendContext&) { return std::make_unique<NullBackend>(); });
  auto g = CollectiveGroup::create(1, 0, "barrier-only", "ops");
  g->barrier();
  std::vector<float> v(3);
  EXPECT_TUTTI_ERROR(g->allreduce(v), ErrorCode::kUnavailable,
                     "backend 'barrier-only' does not support 'allreduce'", "group 'ops'");
}

// init returns on no rank before every rank's backend is up: a rank that destroyed its group
// at once used to close its connections under a rank still connecting (a gloo split failed
// with "Connection closed by peer" under load).
TEST(Registry, InitReturnsOnceEveryRanksBackendIsUp) {
  std::atomic<bool> rank1_up{false};
  register_collective_backend("slow-on-rank-1", [&](const BackendContext& ctx) {
    if (ctx.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      rank1_up = true;
    }
    return std::make_unique<NullBackend>();
  });
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(10000));
  const std::string name = unique_name("slow");
  run_ranks(2, [&](int r) {
    GroupOptions options;
    options.store = store;
    auto g = CollectiveGroup::create(2, r, "slow-on-rank-1", name, options);
    EXPECT_TRUE(rank1_up.load()) << "rank " << r << " returned before rank 1's backend was up";
  });
}

// Every rank of a world (threads, one HashStore) inits `backend`, each expecting to fail;
// `check(rank, error)` looks at each rank's error.
void expect_each_init_fails(int world, const std::string& backend, const std::string& name,
                            std::chrono::milliseconds timeout,
                            const std::function<void(int, const Error&)>& check) {
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(60000));
  run_ranks(world, [&](int r) {
    GroupOptions options;
    options.store = store;
    options.timeout = timeout;
    try {
      CollectiveGroup::create(world, r, backend, name, options);
      ADD_FAILURE() << "rank " << r << ": init succeeded";
    } catch (const Error& e) {
      check(r, e);
    }
  });
}

// A backend that fails on one rank fails the others at once, naming that rank and why, instead
// of leaving them to their timeout.
TEST(Registry, ABackendFailingOnOneRankFailsTheOthersNamingIt) {
  register_collective_backend("fails-on-rank-1", [](const BackendContext& ctx) {
    if (ctx.rank == 1) throw Error(ErrorCode::kUnavailable, "no device here");
    return std::make_unique<NullBackend>();
  });
  const std::string name = unique_name("fails");
  expect_each_init_fails(
      3, "fails-on-rank-1", name, std::chrono::milliseconds(60000), [&](int r, const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("group '" + name + "'"), std::string::npos) << what;
        if (r == 1) {
          EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << what;
          EXPECT_NE(what.find("no device here"), std::string::npos) << what;
        } else {
          EXPECT_EQ(e.code(), ErrorCode::kRemoteError) << what;
          EXPECT_NE(what.find("failed on rank 1: no device here"), std::string::npos) << what;
        }
      });
}

// A rank whose backend comes up after another rank gave up waiting for it is told so, instead of
// returning a group whose peers have gone.
TEST(Registry, ARankUpAfterTheOthersGaveUpIsToldSo) {
  register_collective_backend("late-on-rank-1", [](const BackendContext& ctx) {
    if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(4000));
    return std::make_unique<NullBackend>();
  });
  // 2 s: the meeting before the backends must still form on a loaded machine.
  expect_each_init_fails(2, "late-on-rank-1", unique_name("late"), std::chrono::milliseconds(2000),
                         [](int r, const Error& e) {
                           const std::string what = e.what();
                           if (r == 0) {
                             EXPECT_EQ(e.code(), ErrorCode::kTimeout) << what;
                             EXPECT_NE(what.find("rank(s) 1 not up"), std::string::npos) << what;
                           } else {
                             EXPECT_EQ(e.code(), ErrorCode::kRemoteError) << what;
                             EXPECT_NE(what.find("failed on rank 0: timed out"), std::string::npos)
                                 << what;
                           }
                         });
}

}  // namespace
}  // namespace tutti::testing
