// Work handles and async ops, on every CPU backend, ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
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

// synchronize() on the CPU waits for every async op queued so far.
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
