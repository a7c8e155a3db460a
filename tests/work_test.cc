// Work handles and async ops, on every CPU backend, ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "test_util.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;

class WorkTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string backend() const { return GetParam(); }
};

TEST_P(WorkTest, ABlockingCallReturnsACompletedWork) {
  auto groups = create_groups(2, backend(), unique_name("work-done"));
  run_ranks(2, [&](int r) {
    std::vector<int32_t> v(10, r + 1);
    auto work = groups[r]->allreduce(v);
    ASSERT_NE(work, nullptr);
    EXPECT_TRUE(work->is_completed());
    EXPECT_TRUE(work->is_success());
    EXPECT_EQ(work->exception(), nullptr);
    EXPECT_EQ(work->op(), OpType::kAllreduce);
    EXPECT_EQ(work->seq(), 0u);
    EXPECT_NE(work->description().find("allreduce #0 on group"), std::string::npos);
    work->wait();
    EXPECT_EQ(v[9], 3);
  });
}

// Many async ops of different kinds and sizes in flight, then one blocking op behind them: all
// run in issue order (each result is checked), and the blocking one waits for its turn.
TEST_P(WorkTest, AsyncOpsRunInIssueOrder) {
  const int world = 3;
  auto groups = create_groups(world, backend(), unique_name("work-order"));
  run_ranks(world, [&](int r) {
    CollectiveGroup& g = *groups[r];
    constexpr int kOps = 12;
    std::vector<std::vector<float>> bufs;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < kOps; ++i) bufs.emplace_back(1000 + 50000 * (i % 3), float(r + i));
    for (int i = 0; i < kOps; ++i) {
      if (i % 4 == 3) {
        BroadcastOptions o;
        o.async_op = true;
        o.root_rank = i % world;
        works.push_back(g.broadcast(bufs[i], o));
      } else {
        AllreduceOptions o;
        o.async_op = true;
        works.push_back(g.allreduce(bufs[i], o));
      }
    }
    // Blocking, behind the async ones.
    std::vector<int64_t> last(5, r);
    g.allreduce(last);
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    EXPECT_EQ(last[4], 0 + 1 + 2);
    for (int i = 0; i < kOps; ++i) {
      works[i]->wait();
      const float want = i % 4 == 3 ? float(i % world + i) : float(0 + 1 + 2 + world * i);
      EXPECT_EQ(bufs[i].front(), want) << "op " << i;
      EXPECT_EQ(bufs[i].back(), want) << "op " << i;
      EXPECT_EQ(works[i]->seq(), static_cast<uint64_t>(i));
    }
  });
}

// The caller computes while an allreduce runs on the group's worker; the op's result is right.
TEST_P(WorkTest, TheCallerRunsWhileTheOpRuns) {
  auto groups = create_groups(2, backend(), unique_name("work-overlap"));
  run_ranks(2, [&](int r) {
    std::vector<double> v(1 << 20, r + 0.5);
    AllreduceOptions o;
    o.async_op = true;
    auto work = groups[r]->allreduce(v, o);
    double acc = 0;
    for (int i = 0; i < 1000000; ++i) acc += i * 1e-9;  // independent of the op
    work->wait();
    EXPECT_GT(acc, 0);
    EXPECT_EQ(v[12345], 2.0);
  });
}

// wait(timeout) shorter than the op: kTimeout saying it still runs, the group unaffected; once
// the late rank arrives the same Work completes.
TEST_P(WorkTest, AShortWaitLeavesTheOpAndTheGroupAlone) {
  auto groups = create_groups(2, backend(), unique_name("work-wait"), milliseconds(10000));
  std::atomic<bool> waited{false};
  run_ranks(2, [&](int r) {
    std::vector<int32_t> v(4, r + 1);
    if (r == 1) {
      while (!waited.load()) std::this_thread::sleep_for(milliseconds(1));
      groups[1]->allreduce(v);
    } else {
      AllreduceOptions o;
      o.async_op = true;
      auto work = groups[0]->allreduce(v, o);
      EXPECT_FALSE(work->is_completed());
      EXPECT_TUTTI_ERROR(work->wait(milliseconds(20)), ErrorCode::kTimeout, "is still running",
                         "the group is unaffected");
      EXPECT_FALSE(groups[0]->is_aborted());
      waited = true;
      work->wait();
      EXPECT_TRUE(work->is_success());
    }
    EXPECT_EQ(v[3], 3);
  });
}

// An async op that fails aborts the group exactly as a blocking one does; what was queued
// behind it ends with kAborted without running.
TEST_P(WorkTest, AFailedAsyncOpAbortsTheGroup) {
  auto groups = create_groups(2, backend(), unique_name("work-fail"), milliseconds(10000));
  std::vector<int32_t> v(4, 1), w(4, 1);
  AllreduceOptions o;
  o.async_op = true;
  o.timeout = milliseconds(200);
  // Rank 1 never calls: rank 0's first op times out, the second never starts.
  auto first = groups[0]->allreduce(v, o);
  o.timeout = kUseGroupTimeout;
  auto second = groups[0]->allreduce(w, o);
  EXPECT_TUTTI_ERROR(first->wait(), ErrorCode::kTimeout, "allreduce #0", "timed out");
  EXPECT_TUTTI_ERROR(second->wait(), ErrorCode::kAborted, "allreduce #1",
                     "aborted before this op started");
  EXPECT_TRUE(groups[0]->is_aborted());
  EXPECT_TUTTI_ERROR(groups[0]->barrier(), ErrorCode::kAborted, "aborted by an earlier failure");
  EXPECT_NE(first->exception(), nullptr);
}

TEST_P(WorkTest, KeepAliveHoldsItsObjectAsLongAsTheWork) {
  auto groups = create_groups(1, backend(), unique_name("work-keep"));
  std::vector<int32_t> v(4, 1);
  auto object = std::make_shared<int>(42);
  std::weak_ptr<int> watch = object;
  auto work = groups[0]->allreduce(v);
  work->keep_alive(std::move(object));
  EXPECT_FALSE(watch.expired());
  work.reset();
  EXPECT_TRUE(watch.expired());
}

// on_finish hooks (what torch's futures hang on): every one runs, in the order added, on the
// thread that finishes the op, before its waiters wake, with the op's error; a hook added after
// the op finished runs at once.
TEST_P(WorkTest, EveryFinishHookRunsInOrderBeforeTheWaitersWake) {
  auto groups = create_groups(2, backend(), unique_name("work-hooks"), milliseconds(10000));
  run_ranks(2, [&](int r) {
    std::vector<int32_t> v(1 << 16, r + 1);
    AllreduceOptions o;
    o.async_op = true;
    auto work = groups[r]->allreduce(v, o);
    std::vector<int> order;
    std::atomic<int32_t> seen{0};
    for (int i = 0; i < 3; ++i) {
      work->on_finish([&, i](const std::exception_ptr& error) {
        EXPECT_EQ(error, nullptr);
        order.push_back(i);
        seen = v[(1 << 16) - 1];  // the op's result is there when the hook runs
      });
    }
    work->wait();
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(seen.load(), 3);
    bool late = false;
    work->on_finish([&](const std::exception_ptr&) { late = true; });
    EXPECT_TRUE(late);
  });
  std::vector<int32_t> v(4, 1);
  AllreduceOptions o;
  o.async_op = true;
  o.timeout = milliseconds(100);
  auto failed = groups[0]->allreduce(v, o);  // rank 1 never calls: it times out
  std::exception_ptr a, b;
  failed->on_finish([&](const std::exception_ptr& e) { a = e; });
  failed->on_finish([&](const std::exception_ptr& e) { b = e; });
  EXPECT_TUTTI_ERROR(failed->wait(), ErrorCode::kTimeout, "allreduce");
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(a, b);
}

// A completion hook runs on the group's worker thread. It may destroy the group (0), hold the
// group's last reference (1), or the Work it belongs to may (keep_alive) once the caller dropped
// it (2): the group goes on the worker, which must neither join itself (std::terminate) nor take
// its queue's lock twice (a hang), and the op's result stands. Rank 1 calls only once rank 0's
// hook is in place, so the hook runs on the worker, not at once.
TEST_P(WorkTest, AHookMayDestroyTheGroupOrHoldItsLastReference) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    auto groups =
        create_groups(2, backend(), unique_name("work-hook-ends-group"), milliseconds(10000));
    std::weak_ptr<CollectiveGroup> watch = groups[0];
    std::promise<void> hooked;
    std::thread peer([&, ready = hooked.get_future()] {
      ready.wait();
      std::vector<int32_t> v(1 << 12, 2);
      groups[1]->allreduce(v);
      EXPECT_EQ(v[0], 3);
    });
    std::vector<int32_t> v(1 << 12, 1);
    // Set (release) as the Work goes, after the op wrote v: the read of v below acquires it
    // (variant 2 waits on no Work; a weak_ptr's expiry orders nothing).
    std::atomic<bool> work_gone{false};
    {
      std::shared_ptr<CollectiveGroup> g = std::move(groups[0]);
      AllreduceOptions o;
      o.async_op = true;
      auto w = g->allreduce(v, o);
      if (variant == 0)
        w->on_finish([raw = g.get()](const std::exception_ptr&) { raw->destroy(); });
      if (variant == 1) w->on_finish([g](const std::exception_ptr&) {});
      if (variant == 2) {
        w->keep_alive(g);
        w->keep_alive(std::shared_ptr<int>(new int(0), [&work_gone](int* p) {
          delete p;
          work_gone.store(true, std::memory_order_release);
        }));
      }
      if (variant != 0) g.reset();
      hooked.set_value();
      if (variant == 2) {
        w.reset();
      } else {
        w->wait();
        EXPECT_TRUE(w->is_success());
      }
    }
    peer.join();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((!watch.expired() || (variant == 2 && !work_gone.load(std::memory_order_acquire))) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    EXPECT_TRUE(watch.expired()) << "the group is still there 10 s after its op";
    if (variant == 2) {
      EXPECT_TRUE(work_gone.load(std::memory_order_acquire)) << "the Work is still there";
    }
    if (variant != 2 || work_gone.load(std::memory_order_acquire)) EXPECT_EQ(v[0], 3);
    groups[1]->destroy();
  }
}

// A hook added while finish() runs the earlier ones (from another thread) runs too, before the
// waiters wake.
TEST(WorkHooks, AHookAddedWhileTheHooksRunIsNotLost) {
  auto work = std::make_shared<Work>(OpContext{});
  std::atomic<bool> in_first{false}, go_on{false}, late_ran{false};
  work->on_finish([&](const std::exception_ptr&) {
    in_first = true;
    while (!go_on) std::this_thread::yield();
  });
  std::thread finisher([&] { work->finish(); });
  while (!in_first) std::this_thread::yield();
  work->on_finish([&](const std::exception_ptr&) { late_ran = true; });
  go_on = true;
  work->wait();
  EXPECT_TRUE(late_ran.load()) << "the waiter woke before the late hook ran, or it never ran";
  finisher.join();
  EXPECT_TRUE(late_ran.load());
}

// An op issued from a hook, on the group's worker (what torch's PowerSGD hook does from its
// future's callback: an async allreduce, then a wait for it), runs there: queued behind the op
// whose hook issued it, it would never run.
TEST_P(WorkTest, AnOpIssuedFromAHookRunsAndCanBeWaitedFor) {
  auto groups = create_groups(2, backend(), unique_name("work-hook-issues"), milliseconds(10000));
  run_ranks(2, [&](int r) {
    std::vector<int32_t> v(1 << 16, r + 1), inner(4, 10 * (r + 1));
    AllreduceOptions o;
    o.async_op = true;
    auto w = groups[r]->allreduce(v, o);
    std::atomic<bool> inner_done{false};
    w->on_finish([&](const std::exception_ptr&) {
      groups[r]->issue_from_this_thread();  // torch's backend hands the group to each caller
      auto x = groups[r]->allreduce(inner, o);
      try {
        x->wait(milliseconds(5000));
        inner_done = true;
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
      }
    });
    w->wait();
    EXPECT_TRUE(inner_done.load());
    EXPECT_EQ(v[0], 3);
    EXPECT_EQ(inner[3], 30);
    groups[r]->issue_from_this_thread();
  });
}

// synchronize() on the CPU waits for every async op queued so far.// synchronize() on the CPU waits
// for every async op queued so far.
TEST_P(WorkTest, SynchronizeWaitsForQueuedOps) {
  auto groups = create_groups(2, backend(), unique_name("work-sync"));
  run_ranks(2, [&](int r) {
    std::vector<std::vector<int32_t>> bufs(6, std::vector<int32_t>(20000, r + 1));
    std::vector<std::shared_ptr<Work>> works;
    AllreduceOptions o;
    o.async_op = true;
    for (auto& b : bufs) works.push_back(groups[r]->allreduce(b, o));
    groups[r]->synchronize(Device::cpu());
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    for (auto& b : bufs) EXPECT_EQ(b[19999], 3);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, WorkTest, ::testing::Values("gloo", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
