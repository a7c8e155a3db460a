// The NCCL backend's failure paths, each rank a process: the watchdog aborting a stuck op and a
// stuck caller stream, a failed blocking op that keeps the caller's stream behind it while it
// still runs, a run of ops that wakes the watchdog once, an asynchronous NCCL error (on every
// rank, or one), destroy and abort from
// another thread while ops are pending (their Works end with kAborted), a failed and a
// timed-out communicator init, and a rejected multi-GPU op. After each: every rank's error names
// the op, later ops fail with kAborted, and destroy then re-init works. Under the stand-in each
// child also checks that nothing of the CUDA runtime or NCCL is left alive, and the parent that
// no shared-memory segment is.
//
// Scenarios that inject errors (TUTTI_STANDIN_NCCL_*) need the stand-in; the others also run on
// two real GPUs (label "gpu").
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "nccl_test_util.h"
#include "tutti/store.h"

namespace tutti::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// One rank of a scenario: it joins the group "fault" (again after a destroy), and signals the
// other ranks through keys of its own in the same store.
class Rank {
 public:
  Rank()
      : rank_(env_int("TUTTI_NCCL_TEST_RANK", 0)),
        world_(env_int("TUTTI_NCCL_TEST_WORLD", 1)),
        url_(env_str("TUTTI_NCCL_TEST_STORE")),
        store_(open_store(url_, seconds(60))) {}

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return rank_; }

  std::shared_ptr<CollectiveGroup> join(milliseconds timeout = seconds(30)) {
    cudaSetDevice(device());
    GroupOptions o;
    o.store_url = url_;
    o.timeout = timeout;
    return CollectiveGroup::create(world_, rank_, "nccl", "fault", o);
  }
  void signal(const std::string& what) { store_->set("test/" + what, "1"); }
  void wait_for(const std::string& what) { store_->wait({"test/" + what}, seconds(60)); }

  // A blocking sum over the group of (rank + 1) on each of `n` elements, checked.
  void expect_allreduce_works(CollectiveGroup& g, const std::string& when) {
    const int64_t n = 1000;
    DeviceBuffer buf(device(), n * 4);
    buf.fill(DType::kFloat32, n, [&](int64_t) { return rank_ + 1.0; });
    AllreduceOptions o;
    o.blocking = true;
    g.allreduce(buf.view(DType::kFloat32, n), o);
    expect_values(
        DType::kFloat32, buf.read(DType::kFloat32, n),
        [&](int64_t) { return world_ * (world_ + 1) / 2.0; }, when);
  }

  // Destroys the group, checks the stand-in's counters, then joins again (all ranks) and
  // checks an allreduce.
  void destroy_and_rejoin(std::shared_ptr<CollectiveGroup>& g) {
    g->destroy();
    g.reset();
    expect_standin_clean("after destroy");
    g = join();
    expect_allreduce_works(*g, "allreduce after re-init");
  }

 private:
  int rank_;
  int world_;
  std::string url_;
  std::shared_ptr<Store> store_;
};

// Expects `fn` to throw a tutti::Error whose code is one of `codes` and whose message has every
// needle; returns the message.
std::string expect_error(const std::function<void()>& fn, std::vector<ErrorCode> codes,
                         std::vector<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no error";
    return "";
  } catch (const Error& e) {
    EXPECT_NE(std::find(codes.begin(), codes.end(), e.code()), codes.end()) << e.what();
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.what();
    }
    return e.what();
  }
}

// ---- The scenarios, as each rank runs them ----------------------------------------------------

// Rank 1 never calls op #1: rank 0's blocking op fails at its 500 ms timeout, naming itself.
void stuck_op(Rank& me) {
  auto g = me.join();
  me.expect_allreduce_works(*g, "allreduce #0");
  if (me.rank() == 0) {
    DeviceBuffer buf(me.device(), 1024);
    AllreduceOptions o;
    o.blocking = true;
    o.timeout = milliseconds(500);
    expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256), o); },
                 {ErrorCode::kAborted, ErrorCode::kTimeout},
                 {"allreduce #1", "did not complete within its timeout"});
    // The group is aborted: the next op fails before it is numbered, naming op #1.
    expect_error(
        [&] { g->allreduce(buf.view(DType::kFloat32, 256)); }, {ErrorCode::kAborted},
        {"aborted by an earlier failure", "allreduce #1", "did not complete within its timeout"});
    me.signal("failed");
  } else {
    me.wait_for("failed");
  }
  me.destroy_and_rejoin(g);
}

// Each rank's caller stream is held by a host function; op #1, queued behind it, passes its
// 500 ms timeout. The watchdog's abort may itself wait for that stream (NCCL's does when
// nranks > 1), yet the next call, an allgather into separate outputs that needs a larger
// scratch buffer than op #0 did, must learn of the failure while the stream is still held.
std::atomic<bool> g_released{false};

void stuck_stream(Rank& me) {
  auto g = me.join();
  DeviceBuffer buf(me.device(), 1024);
  DeviceBuffer out0(me.device(), 1024), out1(me.device(), 1024);
  auto allgather = [&](int64_t n, const AllgatherOptions& o) {
    g->allgather({out0.view(DType::kFloat32, n), out1.view(DType::kFloat32, n)},
                 buf.view(DType::kFloat32, n), o);
  };
  AllgatherOptions small;
  small.blocking = true;
  allgather(16, small);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  g_released = false;
  cudaLaunchHostFunc(
      s,
      [](void*) {
        while (!g_released) std::this_thread::sleep_for(milliseconds(1));
      },
      nullptr);
  // Whatever happens, the stream is released after 20 s.
  std::thread timer([] {
    const auto until = Clock::now() + seconds(20);
    while (!g_released && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
    g_released = true;
  });
  AllreduceOptions o;
  o.stream = s;
  o.timeout = milliseconds(500);
  g->allreduce(buf.view(DType::kFloat32, 256), o);  // returns once enqueued
  AllgatherOptions larger;
  larger.blocking = true;
  expect_error([&] { allgather(256, larger); }, {ErrorCode::kAborted},
               {"allreduce #1", "did not complete within its timeout"});
  EXPECT_FALSE(g_released.load()) << "the failure was reported only once the stream was released";
  g_released = true;
  timer.join();
  cudaStreamDestroy(s);
  me.destroy_and_rejoin(g);
}

// TUTTI_STANDIN_NCCL_ASYNC_ERROR: op #2 hits an asynchronous error on every rank, or on rank 1
// only (rank 0's op then waits for rank 1 in vain until its 2 s timeout).
void async_error(Rank& me) {
  const bool everywhere = env_str("TUTTI_STANDIN_NCCL_ASYNC_ERROR").find(':') == std::string::npos;
  auto g = me.join();
  me.expect_allreduce_works(*g, "allreduce #0");
  me.expect_allreduce_works(*g, "allreduce #1");
  DeviceBuffer buf(me.device(), 1024);
  AllreduceOptions o;
  o.blocking = true;
  o.timeout = seconds(2);
  // A rank hit by the error sees it while the op is enqueued (kRemoteError) or from the
  // watchdog (kAborted); the others' op times out. Either way the message names op #2, and so
  // does the kAborted of every later op.
  const bool hit = everywhere || me.rank() == 1;
  const std::vector<std::string> why =
      hit ? std::vector<std::string>{"allreduce #2", "remote process exited"}
          : std::vector<std::string>{"allreduce #2", "did not complete within its timeout"};
  expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256), o); },
               {ErrorCode::kRemoteError, ErrorCode::kAborted, ErrorCode::kTimeout}, why);
  expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256)); }, {ErrorCode::kAborted}, why);
  me.destroy_and_rejoin(g);
}

// TUTTI_STANDIN_NCCL_STALL=1:3000: op #1 runs 3 s late on NCCL's stream, abort or not. A
// blocking op #1 with a 300 ms timeout fails, naming itself, while the op is still on the GPU;
// what the caller queues on its stream afterwards (here an event; a free, a reuse of the buffers
// in a program) must wait for it (cb38c47): the watchdog ends the Work before it has stopped the
// communicators.
void failed_op_orders_the_caller(Rank& me) {
  auto g = me.join();
  me.expect_allreduce_works(*g, "allreduce #0");
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer buf(me.device(), 1024);
  AllreduceOptions o;
  o.blocking = true;
  o.stream = s;
  o.timeout = milliseconds(300);
  const auto start = Clock::now();
  expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256), o); },
               {ErrorCode::kTimeout, ErrorCode::kAborted},
               {"allreduce #1", "did not complete within its timeout"});
  cudaEvent_t after;
  ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
  const auto failed = Clock::now() - start;
  // 2.7 s of the stall's 3 for the 300 ms timeout's failure (1.5 s of stall and 1.2 s until
  // 2026-12-05: a loaded machine under a sanitizer could take the rest).
  ASSERT_LT(failed, milliseconds(2700)) << "the op failed only after its stall: nothing to check";
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady)
      << "the caller's stream ran ahead of an op that was still running";
  // ... and goes on once the op is done (bounded: 3 s of stall).
  const auto until = Clock::now() + seconds(10);
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaEventQuery(after)) == cudaErrorNotReady && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(state, cudaSuccess) << "the caller's stream never went on";
  EXPECT_GE(Clock::now() - start, milliseconds(2900)) << "it went on before the op's end";
  cudaEventDestroy(after);
  cudaStreamDestroy(s);
  me.destroy_and_rejoin(g);
}

// 400 blocking ops on one rank (the stand-in's enqueue at once), in 4 runs of 100 with 500 ms
// between them (the watchdog's idle sleep starts after 50 looks of 2 ms, longer on a loaded
// machine): the NCCL watchdog is woken out of
// its idle sleep once per run, not per op (8c6f108: waking it for every op cost 1.5-2 us of an
// 8-byte op on an H200, and cb38c47 had brought that back unnoticed). The parent counts the debug
// lines that say so. A run whose first op comes while the watchdog is between two of its sleeps
// finds it awake, and wakes nothing: hence several runs (one once failed the count of "at least
// one" under a loaded ctest -j4).
void watchdog_wakes(Rank& me) {
  auto g = me.join();
  for (int run = 0; run < 4; ++run) {
    if (run > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (int i = 0; i < 100; ++i) {
      me.expect_allreduce_works(*g, "allreduce #" + std::to_string(100 * run + i));
    }
  }
  g->destroy();
}

// Rank 1 never calls op #1. On rank 0 another thread destroys the group: first while op #1 is
// enqueued (destroy aborts it at once), then while a blocking op #1 waits in a thread (destroy
// returns once that op has failed, at the latest at its 3 s timeout).
void destroy_while_pending(Rank& me) {
  auto g = me.join();
  me.expect_allreduce_works(*g, "allreduce #0");
  if (me.rank() == 0) {
    DeviceBuffer buf(me.device(), 1024);
    AllreduceOptions o;
    o.timeout = seconds(60);
    auto pending = g->allreduce(buf.view(DType::kFloat32, 256), o);  // rank 1 never joins it
    EXPECT_FALSE(pending->is_completed());
    const auto start = Clock::now();
    std::thread([&] { g->destroy(); }).join();
    EXPECT_LT(Clock::now() - start, seconds(5)) << "destroy waited for the pending op";
    // Its Work has ended with the destroy, and holds nothing of CUDA any more.
    EXPECT_TRUE(pending->is_completed());
    expect_error([&] { pending->wait(); }, {ErrorCode::kAborted},
                 {"allreduce #1", "was still pending when the group was destroyed"});
    expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256)); }, {ErrorCode::kInvalidUsage},
                 {"destroyed"});
    g.reset();
    expect_standin_clean("after destroying a group with an op pending");
    me.signal("destroyed-1");
  } else {
    me.wait_for("destroyed-1");
    g->destroy();
    g.reset();
  }
  g = me.join();
  me.expect_allreduce_works(*g, "allreduce #0 of the second incarnation");
  if (me.rank() == 0) {
    DeviceBuffer buf(me.device(), 1024);
    std::thread op([&] {
      AllreduceOptions o;
      o.blocking = true;
      o.timeout = seconds(3);
      // kInvalidUsage only where destroy came first (the stand-in's counter below avoids that).
      expect_error([&] { g->allreduce(buf.view(DType::kFloat32, 256), o); },
                   {ErrorCode::kAborted, ErrorCode::kTimeout, ErrorCode::kInvalidUsage},
                   {"allreduce"});
    });
    // Destroy while the op waits: under the stand-in, once its completion events exist.
    const auto start = Clock::now();
    while (standin::active() && standin::count("tutti_standin_cuda_live_events") == 0 &&
           Clock::now() - start < seconds(2)) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    g->destroy();
    op.join();
    EXPECT_LT(Clock::now() - start, seconds(15));
    g.reset();
    expect_standin_clean("after destroying a group with a blocking op waiting");
    me.signal("destroyed-2");
  } else {
    me.wait_for("destroyed-2");
    g->destroy();
    g.reset();
  }
  g = me.join();
  me.expect_allreduce_works(*g, "allreduce after re-init");
}

// One process, two devices (NCCL ranks 0 and 1). The init of NCCL rank 1 fails
// (TUTTI_STANDIN_NCCL_INIT_ERROR=1) or every init outlasts the group's 1 s timeout
// (TUTTI_STANDIN_NCCL_DELAY_MS): the op fails naming itself, and the half-made communicators
// and their streams are gone at once.
void init_failure(Rank& me) {
  const bool timeout = !env_str("TUTTI_STANDIN_NCCL_DELAY_MS").empty();
  auto g = me.join(timeout ? seconds(1) : seconds(30));
  DeviceBuffer a(0, 1024), b(1, 1024);
  const std::vector<TensorView> list = {a.view(DType::kFloat32, 256), b.view(DType::kFloat32, 256)};
  if (timeout) {
    expect_error([&] { g->allreduce_multigpu(list); }, {ErrorCode::kTimeout},
                 {"allreduce #0", "still being set up"});
  } else {
    expect_error([&] { g->allreduce_multigpu(list); }, {ErrorCode::kIoError},
                 {"allreduce #0", "ncclCommInitRankConfig", "injected init failure"});
  }
  EXPECT_EQ(standin::count("tutti_standin_nccl_live_comms"), 0) << "communicators left behind";
  EXPECT_EQ(standin::count("tutti_standin_cuda_live_streams"), 0) << "streams left behind";
  expect_error([&] { g->allreduce_multigpu(list); }, {ErrorCode::kAborted}, {"allreduce #0"});
  g->destroy();
  g.reset();
  expect_standin_clean("after destroy");
  if (timeout) return;  // every init would take as long again
  g = me.join();
  a.fill(DType::kFloat32, 256, [](int64_t) { return 1.0; });
  b.fill(DType::kFloat32, 256, [](int64_t) { return 2.0; });
  g->allreduce_multigpu(list);
  expect_values(
      DType::kFloat32, a.read(DType::kFloat32, 256), [](int64_t) { return 3.0; }, "cuda:0");
  expect_values(
      DType::kFloat32, b.read(DType::kFloat32, 256), [](int64_t) { return 3.0; }, "cuda:1");
}

// Rank 1 never calls op #1. On rank 0, abort() from another thread ends it, whether the op
// thread waits in a blocking call or holds an async Work, long before its 60 s timeout, naming
// the op and the reason; later calls fail naming the reason; destroy and re-init then work.
void abort_from_another_thread(Rank& me) {
  auto g = me.join(seconds(60));
  me.expect_allreduce_works(*g, "allreduce #0");
  if (me.rank() == 0) {
    DeviceBuffer buf(me.device(), 1024);
    AllreduceOptions o;
    o.async_op = true;
    auto work = g->allreduce(buf.view(DType::kFloat32, 256), o);
    std::thread blocked([&] {
      AllgatherOptions b;
      b.blocking = true;
      DeviceBuffer out(me.device(), 2048);
      expect_error(
          [&] { g->allgather(out.view(DType::kFloat32, 512), buf.view(DType::kFloat32, 256), b); },
          {ErrorCode::kAborted}, {"allgather #2", "the test says stop"});
    });
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_FALSE(work->is_completed());
    const auto start = Clock::now();
    g->abort("the test says stop");
    expect_error([&] { work->wait(); }, {ErrorCode::kAborted},
                 {"allreduce #1", "the test says stop"});
    blocked.join();
    EXPECT_LT(Clock::now() - start, seconds(2)) << "abort did not end the ops promptly";
    expect_error([&] { g->barrier(); }, {ErrorCode::kAborted}, {"the test says stop"});
    me.signal("aborted");
  } else {
    me.wait_for("aborted");
  }
  me.destroy_and_rejoin(g);
}

const std::map<std::string, void (*)(Rank&)>& scenarios() {
  static const std::map<std::string, void (*)(Rank&)> all = {
      {"stuck_op", stuck_op},
      {"stuck_stream", stuck_stream},
      {"async_error", async_error},
      {"destroy_while_pending", destroy_while_pending},
      {"init_failure", init_failure},
      {"abort_from_another_thread", abort_from_another_thread},
      {"failed_op_orders_the_caller", failed_op_orders_the_caller},
      {"watchdog_wakes", watchdog_wakes},
  };
  return all;
}

TEST(NcclFaultChild, Run) {
  const std::string name = env_str("TUTTI_NCCL_TEST_SCENARIO");
  if (name.empty()) GTEST_SKIP() << "runs only as a child of the NcclFault tests";
  Rank me;
  scenarios().at(name)(me);
  if (!::testing::Test::HasFailure()) std::printf("SCENARIO OK\n");
}

// Runs `scenario` with `world` ranks as processes, each with `env` added; returns what each
// printed.
std::vector<std::string> run_scenario(const std::string& scenario, int world,
                                      std::vector<std::string> env = {}) {
  TempDir dir;
  const std::string tag = "fault" + std::to_string(::getpid()) + scenario;
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> e = {
        "TUTTI_NCCL_TEST_SCENARIO=" + scenario, "TUTTI_NCCL_TEST_RANK=" + std::to_string(r),
        "TUTTI_NCCL_TEST_WORLD=" + std::to_string(world),
        "TUTTI_NCCL_TEST_STORE=file://" + dir.path() + "/store", "TUTTI_STANDIN_TAG=" + tag};
    e.insert(e.end(), env.begin(), env.end());
    envs.push_back(std::move(e));
  }
  const auto results = run_children("NcclFaultChild.Run", envs, seconds(120));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("SCENARIO OK"), std::string::npos) << "rank " << r << ":\n"
                                                                        << results[r].output;
  }
  EXPECT_TRUE(standin_segments(tag).empty()) << "shared-memory segments left in /dev/shm";
  std::vector<std::string> outputs;
  for (const auto& r : results) outputs.push_back(r.output);
  return outputs;
}

TEST(NcclFault, TheWatchdogAbortsAStuckOpAndNamesIt) {
  SKIP_WITHOUT_GPUS(2);
  run_scenario("stuck_op", 2);
}

TEST(NcclFault, AStuckCallerStreamFailsTheOpWhileStillStuck) {
  SKIP_WITHOUT_GPUS(2);
  run_scenario("stuck_stream", 2);
}

TEST(NcclFault, AnAsyncErrorOnEveryRankFailsEachNamingTheOp) {
  SKIP_WITHOUT_STANDIN();
  run_scenario("async_error", 2, {"TUTTI_STANDIN_NCCL_ASYNC_ERROR=2"});
}

TEST(NcclFault, AnAsyncErrorOnOneRankFailsEveryRankNamingTheOp) {
  SKIP_WITHOUT_STANDIN();
  run_scenario("async_error", 2, {"TUTTI_STANDIN_NCCL_ASYNC_ERROR=2:1"});
}

TEST(NcclFault, AFailedBlockingOpKeepsTheCallersStreamBehindIt) {
  SKIP_WITHOUT_STANDIN();
  run_scenario("failed_op_orders_the_caller", 1, {"TUTTI_STANDIN_NCCL_STALL=1:3000"});
}

TEST(NcclFault, ARunOfOpsWakesTheWatchdogOnce) {
  SKIP_WITHOUT_STANDIN();
  const auto out =
      run_scenario("watchdog_wakes", 1, {"TUTTI_STANDIN_NCCL_DELAY_MS=0", "TUTTI_LOG_LEVEL=debug"});
  ASSERT_EQ(out.size(), 1u);
  const std::string needle = "wakes the watchdog from its idle sleep";
  int wakes = 0;
  for (size_t at = out[0].find(needle); at != std::string::npos;
       at = out[0].find(needle, at + needle.size())) {
    ++wakes;
  }
  // A run's first op wakes it; another wake needs 100 ms without an op (a stalled machine).
  EXPECT_GE(wakes, 1) << out[0];
  EXPECT_LE(wakes, 4 + 8) << "woken " << wakes << " times for 400 ops in 4 runs";
}

TEST(NcclFault, DestroyFromAnotherThreadWhileAnOpIsPending) {
  SKIP_WITHOUT_GPUS(2);
  run_scenario("destroy_while_pending", 2);
}

TEST(NcclFault, AbortFromAnotherThreadEndsPendingOpsNamingTheReason) {
  SKIP_WITHOUT_GPUS(2);
  run_scenario("abort_from_another_thread", 2);
}

TEST(NcclFault, AFailedInitLeavesNothingBehind) {
  SKIP_WITHOUT_STANDIN();
  run_scenario("init_failure", 1, {"TUTTI_STANDIN_NCCL_INIT_ERROR=1"});
}

TEST(NcclFault, ATimedOutInitLeavesNothingBehind) {
  SKIP_WITHOUT_STANDIN();
  run_scenario("init_failure", 1, {"TUTTI_STANDIN_NCCL_DELAY_MS=60000"});
}

// A multi-GPU op that NCCL rejects on its second device (a buffer of device 0 labelled as
// device 1) fails with kInvalidArgument; the group stays usable: the next op's values are right
// (an NCCL group left open by the failure would swallow it).
TEST(NcclFault, ARejectedMultiGpuOpLeavesTheGroupUsable) {
  SKIP_WITHOUT_STANDIN();
  SKIP_WITHOUT_GPUS(2);
  auto g = CollectiveGroup::create(1, 0, "nccl", unique_name("rejected"));
  DeviceBuffer a(0, 1024), b(1, 1024), wrong(0, 1024);
  const TensorView mislabelled(wrong.data(), DType::kFloat32, {256}, Device::cuda(1));
  expect_error(
      [&] {
        g->allreduce_multigpu({a.view(DType::kFloat32, 256), mislabelled});
      },
      {ErrorCode::kInvalidArgument}, {"allreduce #0", "ncclAllReduce"});
  a.fill(DType::kFloat32, 256, [](int64_t) { return 1.0; });
  b.fill(DType::kFloat32, 256, [](int64_t) { return 2.0; });
  g->allreduce_multigpu({a.view(DType::kFloat32, 256), b.view(DType::kFloat32, 256)});
  expect_values(
      DType::kFloat32, a.read(DType::kFloat32, 256), [](int64_t) { return 3.0; }, "cuda:0");
  expect_values(
      DType::kFloat32, b.read(DType::kFloat32, 256), [](int64_t) { return 3.0; }, "cuda:1");
  g->destroy();
}

}  // namespace
}  // namespace tutti::testing
