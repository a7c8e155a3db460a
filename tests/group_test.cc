// Group behaviour with ranks as threads: barrier, groups side by side, mismatches, aborts.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_util.h"
#include "tutti/embedding.h"
#include "tutti/transfer_agent.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

TEST(Group, BarrierHoldsEveryRankUntilAllArrive) {
  for (int world : {2, 3, 5}) {
    auto groups = create_groups(world, "gloo", unique_name("barrier"));
    std::atomic<int> arrived[5] = {};
    run_ranks(world, [&](int r) {
      for (int round = 0; round < 5; ++round) {
        arrived[round]++;
        groups[r]->barrier();
        // Nobody leaves round k's barrier before every rank has entered it.
        EXPECT_EQ(arrived[round].load(), world) << "rank " << r << " round " << round;
      }
    });
  }
}

TEST(Group, SeveralGroupsRunSideBySide) {
  // Two groups over the same four threads, the second with ranks reversed, used concurrently
  // from two threads per rank.
  const std::string a = unique_name("side-a"), b = unique_name("side-b");
  auto store = std::make_shared<HashStore>();
  std::vector<std::shared_ptr<CollectiveGroup>> ga(4), gb(4);
  run_ranks(4, [&](int r) {
    GroupOptions o;
    o.store = store;
    ga[r] = CollectiveGroup::create(4, r, "gloo", a, o);
    gb[r] = CollectiveGroup::create(4, 3 - r, "gloo", b, o);
  });
  run_ranks(4, [&](int r) {
    std::thread other([&] {
      for (int i = 0; i < 20; ++i) {
        std::vector<int32_t> v(100, gb[r]->rank());
        gb[r]->allreduce(v, {});
        EXPECT_EQ(v[99], 6);
      }
    });
    for (int i = 0; i < 20; ++i) {
      std::vector<float> v(1000, static_cast<float>(r));
      AllreduceOptions o;
      o.reduce_op = ReduceOp::kMax;
      ga[r]->allreduce(v, o);
      EXPECT_EQ(v[0], 3.0f);
    }
    other.join();
  });
}

TEST(Group, ZeroElementOpsComplete) {
  auto groups = create_groups(3, "gloo", unique_name("empty"));
  run_ranks(3, [&](int r) {
    TensorView empty(nullptr, DType::kFloat32, {0});
    groups[r]->allreduce(empty);
    groups[r]->allgather(std::vector<TensorView>{empty, empty, empty}, empty);
    groups[r]->broadcast(empty);
    std::vector<float> v(2, 1.0f);
    groups[r]->allreduce(v);  // the group is still in step after the skipped ops
    EXPECT_EQ(v[0], 3.0f);
  });
}

TEST(Group, MismatchedOpsTimeOutOnEveryRankAndAbort) {
  auto groups = create_groups(2, "gloo", unique_name("mismatch"), milliseconds(800));
  run_ranks(2, [&](int r) {
    CollectiveGroup& g = *groups[r];
    std::vector<float> v(r == 0 ? 8 : 9, 1.0f);
    // The first rank to time out aborts the group, which resets its connections; the other may
    // see that (kRemoteError naming it, or kIoError) before its own timeout. Either way: an
    // Error naming the op, and an abort.
    try {
      if (r == 0) {
        g.allreduce(v);
      } else {
        g.broadcast(v, BroadcastOptions{});
      }
      ADD_FAILURE() << "mismatched ops succeeded on rank " << r;
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kIoError ||
                  e.code() == ErrorCode::kRemoteError)
          << e.what();
      const std::string want = r == 0 ? "allreduce #0 on group" : "broadcast #0 on group";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_TRUE(g.is_aborted());
    EXPECT_TUTTI_ERROR(g.barrier(), ErrorCode::kAborted, "aborted by an earlier failure",
                       "destroy it and initialise it again");
  });
}

TEST(Group, RecvFromASilentPeerTimesOutNamingIt) {
  auto groups = create_groups(2, "gloo", unique_name("silent"), milliseconds(500));
  run_ranks(2, [&](int r) {
    if (r != 0) return;
    std::vector<float> v(4);
    EXPECT_TUTTI_ERROR(groups[0]->recv(v, 1), ErrorCode::kTimeout, "recv #0",
                       "waiting for rank 1 to send");
  });
}

TEST(Group, DestroyIsLocalAndIdempotent) {
  auto groups = create_groups(2, "gloo", unique_name("destroy"));
  groups[1]->destroy();
  groups[1]->destroy();
  EXPECT_TRUE(groups[1]->is_destroyed());
  EXPECT_FALSE(groups[0]->is_destroyed());
  std::vector<float> v(1);
  EXPECT_TUTTI_ERROR(groups[1]->allreduce(v), ErrorCode::kInvalidUsage, "destroyed");
}

TEST(Group, TheStoreHostsDestroyReturnsAtOnceWhileAPeerSleeps) {
  // Rank 0 hosts the TCP store; rank 1 is busy elsewhere for 3 s before it destroys. Rank 0's
  // destroy does not wait for it (the store keeps serving on a thread), and rank 1's teardown
  // still finds the store.
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  const std::string name = unique_name("host-destroy");
  std::vector<double> destroy_ms(2);
  run_ranks(2, [&](int r) {
    GroupOptions o;
    o.store_url = url;
    o.timeout = milliseconds(5000);
    auto g = CollectiveGroup::create(2, r, "gloo", name, o);
    std::vector<float> v(4, 1.0f);
    g->allreduce(v);
    if (r == 1) std::this_thread::sleep_for(milliseconds(3000));
    const auto start = std::chrono::steady_clock::now();
    g->destroy();
    destroy_ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_LT(destroy_ms[0], 1000) << "the host's destroy waited for the sleeping peer";
  EXPECT_LT(destroy_ms[1], 1000) << "the late rank's teardown did not find the store";
}

// A rank that comes to shrink after the others decided without it (they waited out their
// shrink timeout for it) is told so, naming the members; the others' group works.
TEST(Group, ALateRankIsLeftOutOfAShrinkByName) {
  auto groups = create_groups(3, "gloo", unique_name("late-shrink"));
  std::vector<std::shared_ptr<CollectiveGroup>> small(3);
  ShrinkOptions o;
  o.timeout = milliseconds(300);
  run_ranks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(milliseconds(1500));  // past the others' 300 ms
      EXPECT_TUTTI_ERROR(groups[2]->shrink(o), ErrorCode::kAborted,
                         "formed their group of ranks 0,1 without rank 2");
      return;
    }
    small[r] = groups[r]->shrink(o);
    std::vector<float> v(4, static_cast<float>(r + 1));
    small[r]->allreduce(v);
    EXPECT_EQ(v[0], 3.0f);
  });
  for (auto& g : small) {
    if (g) g->destroy();
  }
}

// destroy() from another thread while a shrink waits for a rank: the shrink ends at once with
// a named error, nothing hangs.
TEST(Group, DestroyDuringAShrinkEndsIt) {
  auto groups = create_groups(2, "shm", unique_name("destroyed-shrink"));
  ShrinkOptions o;
  o.timeout = milliseconds(20000);  // rank 1 never comes: only the destroy can end it
  std::atomic<bool> ended{false};
  std::atomic<bool> calling{false};  // the shrinker is at its call (a thread may start late)
  std::thread shrinker([&] {
    groups[0]->issue_from_this_thread();
    calling = true;
    EXPECT_TUTTI_ERROR(groups[0]->shrink(o), ErrorCode::kAborted, "destroyed during the shrink");
    ended = true;
  });
  while (!calling) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  groups[0]->destroy();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  shrinker.join();
  EXPECT_TRUE(ended.load());
  EXPECT_LT(ms, 1000) << "destroy waited for the shrink";
  groups[1]->destroy();
}

TEST(Group, ReinitThroughTheSameStoreIsAFreshIncarnation) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique_name("again");
  for (int round = 0; round < 3; ++round) {
    auto groups = create_groups(3, "gloo", name, milliseconds(20000), store);
    run_ranks(3, [&](int r) {
      std::vector<int32_t> v(10, r + round);
      groups[r]->allreduce(v);
      EXPECT_EQ(v[0], 3 + 3 * round);
      groups[r]->destroy();
    });
  }
}

// ---- blocking hooks (tutti/embedding.h) -------------------------------------------------------

struct HookLog {
  std::atomic<int> entered{0};
  std::atomic<int> left{0};
  std::atomic<int> wrong_token{0};
  std::thread::id entered_on;
  bool give_token = true;
};
HookLog* g_hook_log = nullptr;
int g_hook_token = 0;

void* log_enter() {
  g_hook_log->entered++;
  g_hook_log->entered_on = std::this_thread::get_id();
  return g_hook_log->give_token ? &g_hook_token : nullptr;
}
void log_leave(void* token) {
  if (token != &g_hook_token) g_hook_log->wrong_token++;
  g_hook_log->left++;
}

// Installs the logging hooks for a test, and none again after it, whatever ends it.
class LoggedHooks {
 public:
  explicit LoggedHooks(HookLog& log) {
    g_hook_log = &log;
    tutti::set_blocking_hooks({&log_enter, &log_leave});
  }
  ~LoggedHooks() {
    tutti::set_blocking_hooks({});
    g_hook_log = nullptr;
  }
  LoggedHooks(const LoggedHooks&) = delete;
  LoggedHooks& operator=(const LoggedHooks&) = delete;
};

TEST(Embedding, AGroupsAndAnAgentsTeardownRunTheBlockingHooksOnceOnTheirThread) {
  HookLog log;
  LoggedHooks hooks(log);
  auto group = CollectiveGroup::create(1, 0, "gloo", unique_name("hooks"));
  EXPECT_EQ(log.entered.load(), 0);  // nothing but a teardown runs them
  std::thread([&] { group->destroy(); }).join();
  EXPECT_EQ(log.entered.load(), 1);
  EXPECT_EQ(log.left.load(), 1);
  EXPECT_NE(log.entered_on, std::this_thread::get_id());  // the destroying thread's
  // Destroyed already: nothing waits, neither here nor in the destructor.
  group->destroy();
  group.reset();
  EXPECT_EQ(log.entered.load(), 1);

  TransferAgentOptions o;
  o.name = unique_name("hooks-agent");
  auto agent = TransferAgent::create(o);
  agent.reset();  // its stop
  EXPECT_EQ(log.entered.load(), 2);
  EXPECT_EQ(log.left.load(), 2);
  EXPECT_EQ(log.entered_on, std::this_thread::get_id());

  // An enter that gives nothing back (its thread held no lock) gets no leave.
  log.give_token = false;
  CollectiveGroup::create(1, 0, "gloo", unique_name("hooks"))->destroy();
  EXPECT_EQ(log.entered.load(), 3);
  EXPECT_EQ(log.left.load(), 2);
  EXPECT_EQ(log.wrong_token.load(), 0);

  tutti::set_blocking_hooks({});  // none: none run
  CollectiveGroup::create(1, 0, "gloo", unique_name("hooks"))->destroy();
  EXPECT_EQ(log.entered.load(), 3);
}

TEST(Embedding, OneHookWithoutTheOtherIsRefused) {
  EXPECT_TUTTI_ERROR(tutti::set_blocking_hooks({&log_enter, nullptr}), ErrorCode::kInvalidArgument,
                     "enter given without leave");
  EXPECT_TUTTI_ERROR(tutti::set_blocking_hooks({nullptr, &log_leave}), ErrorCode::kInvalidArgument,
                     "leave given without enter");
  HookLog log;
  g_hook_log = &log;
  CollectiveGroup::create(1, 0, "gloo", unique_name("hooks"))->destroy();  // none installed
  EXPECT_EQ(log.entered.load(), 0);
  g_hook_log = nullptr;
}

}  // namespace
}  // namespace tutti::testing
