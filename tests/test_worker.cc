// A rank of a multi-process test, started by run_workers (test_util.cc):
//   tutti_test_worker <scenario> <rank> <world_size> <store_url> [timeout_ms [backend]]
// Exits 0 when every check of the scenario held, 1 with a message on stderr otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/resource.h>

#include "../backends/shm/shm_slice.h"
#include "tutti/tutti.h"

using namespace tutti;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int rank = 0;
  int world = 1;
  std::string store_url;
  std::chrono::milliseconds timeout{30000};
  std::string backend = "gloo";
};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// Runs fn and returns the tutti::Error it threw; fails when it threw none.
Error expect_error(const std::function<void()>& fn, ErrorCode code, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    require(e.code() == code, std::string("error code ") + to_string(e.code()) + " != expected " +
                                  to_string(code) + ": " + e.what());
    require(std::string(e.what()).find(needle) != std::string::npos,
            "message lacks '" + needle + "': " + e.what());
    std::fprintf(stderr, "expected error: %s\n", e.what());
    return e;
  }
  throw std::runtime_error("expected a tutti::Error containing '" + needle + "'");
}

GroupOptions options(const Args& a) {
  GroupOptions o;
  o.store_url = a.store_url;
  o.timeout = a.timeout;
  return o;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Times that other processes of this host read (steady_clock is CLOCK_MONOTONIC, one clock for
// all of them): `t` in microseconds written to `path` whole (a temporary file renamed), and read
// back; a file not there reads as -1.
int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

void write_time(const std::string& path, Clock::time_point t) {
  FILE* f = std::fopen((path + ".tmp").c_str(), "w");
  require(f != nullptr, "writing " + path);
  std::fprintf(f, "%lld\n", static_cast<long long>(micros(t)));
  require(std::fclose(f) == 0, "writing " + path);
  require(std::rename((path + ".tmp").c_str(), path.c_str()) == 0, "renaming " + path);
}

int64_t read_time(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  long long t = -1;
  const bool read = std::fscanf(f, "%lld", &t) == 1;
  std::fclose(f);
  require(read, "reading " + path);
  return t;
}

void scenario_allreduce(const Args& a) {
  init_collective_group(a.world, a.rank, "gloo", "default", options(a));
  require(get_rank() == a.rank && get_collective_group_size() == a.world, "rank and size");
  std::vector<float> v(1000, static_cast<float>(a.rank + 1));
  allreduce(v);
  const float want = a.world * (a.world + 1) / 2.0f;
  for (float x : v) require(x == want, "allreduce sum " + std::to_string(x));
  destroy_collective_group();
  require(!is_group_initialized(), "destroyed");
}

void scenario_ray(const Args& a) {
  require(a.world == 2, "the ray scenario runs with 2 ranks");
  const int r = a.rank;
  const GroupOptions o = options(a);
  // Two named groups on the same processes, ranks reversed in the second.
  init_collective_group(2, r, "gloo", "a", o);
  init_collective_group(2, 1 - r, "GLOO", "b", o);
  require(get_rank("a") == r && get_rank("b") == 1 - r, "ranks in a and b");
  require(get_rank("nope") == -1 && get_collective_group_size("nope") == -1, "unknown group -1");
  expect_error([&] { init_collective_group(2, r, "gloo", "a", o); }, ErrorCode::kInvalidUsage,
               "already initialized");

  // Rank values 2 and 3: product 6, min 2, max 3.
  for (auto [op, want] : {std::pair{ReduceOp::kProduct, 6}, std::pair{ReduceOp::kMin, 2},
                          std::pair{ReduceOp::kMax, 3}, std::pair{ReduceOp::kSum, 5}}) {
    std::vector<int32_t> v(3, r + 2);
    allreduce(v, "b", op);
    for (int32_t x : v) require(x == want, std::string("allreduce ") + to_string(op));
  }

  // Reduce changes only dst.
  std::vector<double> d(4, r + 2.0);
  reduce(d, 1, "a");
  for (double x : d) require(x == (r == 1 ? 5.0 : 2.0), "reduce changes only dst");

  // Send and recv, both directions.
  std::vector<int64_t> msg(5, 100 + r), got(5, 0);
  if (r == 0) {
    send(msg, 1, "a");
    recv(got, 1, "a");
  } else {
    recv(got, 0, "a");
    send(msg, 0, "a");
  }
  for (int64_t x : got) require(x == 100 + (1 - r), "sendrecv payload");

  // Ten groups side by side.
  for (int k = 0; k < 10; ++k) init_collective_group(2, r, "gloo", "ten-" + std::to_string(k), o);
  for (int k = 0; k < 10; ++k) {
    std::vector<int32_t> v(2, k + r);
    allreduce(v, "ten-" + std::to_string(k));
    require(v[0] == 2 * k + 1, "ten groups: group " + std::to_string(k));
  }
  for (int k = 0; k < 10; ++k) destroy_collective_group("ten-" + std::to_string(k));

  // Destroy on one rank leaves the other's group intact.
  if (r == 1) destroy_collective_group("a");
  barrier("b");
  require(is_group_initialized("a") == (r == 0), "destroy on rank 1 only");
  if (r == 0) destroy_collective_group("a");
  destroy_collective_group("never-initialized");  // a logged no-op

  // Ops after destroy fail; a handle kept from before fails too.
  expect_error([&] { allreduce(d, "a"); }, ErrorCode::kInvalidUsage, "not initialized");
  auto handle = get_group("b");
  barrier("b");

  // Destroy, then re-init the same name through the same store: a fresh incarnation.
  init_collective_group(2, r, "gloo", "a", o);
  std::vector<float> f(3, 1.5f * (r + 1));
  allreduce(f, "a");
  require(f[0] == 4.5f, "allreduce after re-init");
  destroy_collective_group("b");
  expect_error([&] { handle->barrier(); }, ErrorCode::kInvalidUsage, "destroyed");
  destroy_collective_group("a");
}

void scenario_never_arrive(const Args& a) {
  // Started for every rank but the last, which never arrives.
  const auto start = Clock::now();
  expect_error([&] { init_collective_group(a.world, a.rank, "gloo", "default", options(a)); },
               ErrorCode::kTimeout, "missing rank(s) " + std::to_string(a.world - 1));
  std::fprintf(stderr, "elapsed_ms=%.0f\n", ms_since(start));
}

// Through a tcp:// store rank 0 hosts, which is never started or (when it is) SIGKILLed half a
// second into the rendezvous: the other ranks fail within their timeout and one
// store timeout, saying that rank 0 hosts the store and is not there.
void scenario_host_gone(const Args& a) {
  if (a.rank == 0) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ::raise(SIGKILL);
    }).detach();
    init_collective_group(a.world, a.rank, "gloo", "default", options(a));
    return;
  }
  const auto start = Clock::now();
  // kTimeout when this rank was between store calls (its reconnects fail until the store's
  // timeout), kIoError when the host died under one of its waits (the connection closed): both
  // name the host.
  try {
    init_collective_group(a.world, a.rank, "gloo", "default", options(a));
    require(false, "init succeeded without the store's host");
  } catch (const Error& e) {
    const std::string what = e.what();
    require(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kIoError,
            std::string("a timeout or I/O error, not ") + to_string(e.code()) + ": " + what);
    require(what.find("rank 0 hosts this group's store") != std::string::npos,
            "names the store's host: " + what);
  }
  std::fprintf(stderr, "elapsed_ms=%.0f\n", ms_since(start));
}

// The caller's own TCP store (GroupOptions::store), as tutti.ray makes one: rank 0 hosts it on
// port 0 (the server goes with its last TCPStore) and tells the others the port through the
// file store `a.store_url`. Rank 0 destroys and drops its store at once and lives on; rank 1
// destroys a second later, and its teardown still finds the store (it waited out its store's
// whole timeout when the server went with its caller's last reference). `shrunk`: world 3, and
// the group destroyed so is the one ranks 0 and 1 shrink to after rank 2 left (a shrink's group
// takes the store's leaving over from its parent).
void caller_store(const Args& a, bool shrunk) {
  auto ports = open_store(a.store_url, a.timeout);
  TCPStoreOptions so;
  so.host = a.rank == 0;
  so.timeout = a.timeout;
  GroupOptions o;
  if (a.rank == 0) {
    o.store = std::make_shared<TCPStore>("127.0.0.1", 0, so);
    ports->set("port", std::to_string(dynamic_cast<TCPStore&>(*o.store).port()));
  } else {
    o.store = std::make_shared<TCPStore>("127.0.0.1",
                                         static_cast<uint16_t>(std::stoi(ports->get("port"))), so);
  }
  o.timeout = a.timeout;
  auto g = CollectiveGroup::create(a.world, a.rank, "gloo", "callers", o);
  o.store.reset();
  std::vector<float> v(4, 1.0f);
  g->allreduce(v);
  require(v[0] == static_cast<float>(a.world), "allreduce");
  std::shared_ptr<CollectiveGroup> parent;
  if (shrunk) {
    if (a.rank == 2) {
      g->destroy();
      return;
    }
    ShrinkOptions sh;
    sh.exclude = {2};
    parent = g;
    g = parent->shrink(sh);
    std::fill(v.begin(), v.end(), 1.0f);
    g->allreduce(v);
    require(g->world_size() == 2 && v[0] == 2.0f, "allreduce of the shrunk group");
  }
  if (a.rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const auto start = Clock::now();
  g->destroy();
  g.reset();
  if (parent) parent->destroy();
  parent.reset();
  std::fprintf(stderr, "destroy_ms=%.0f\n", ms_since(start));
  if (a.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
}

void scenario_caller_store(const Args& a) {
  caller_store(a, false);
}
void scenario_caller_store_shrunk(const Args& a) {
  caller_store(a, true);
}

void scenario_op_timeout(const Args& a) {
  // Rank 1 joins but never calls the allreduce; rank 0's times out and aborts the group.
  GroupOptions o = options(a);
  o.timeout = std::chrono::seconds(30);
  init_collective_group(a.world, a.rank, "gloo", "stuck", o);
  auto store = open_store(a.store_url);
  if (a.rank == 0) {
    std::vector<float> v(10, 1.0f);
    AllreduceOptions opts;
    opts.timeout = a.timeout;
    const auto start = Clock::now();
    expect_error([&] { get_group("stuck")->allreduce(v, opts); }, ErrorCode::kTimeout,
                 "allreduce #0 on group 'stuck' (rank 0/2)");
    std::fprintf(stderr, "elapsed_ms=%.0f\n", ms_since(start));
    expect_error([&] { allreduce(v, "stuck"); }, ErrorCode::kAborted, "aborted");
    store->set("rank0-done", "1");
  } else {
    store->wait({"rank0-done"}, std::chrono::seconds(60));
  }
  destroy_collective_group("stuck");
}

void scenario_mismatch(const Args& a) {
  // Rank 0 reduces 10 elements, rank 1 reduces 12: both must fail, neither may terminate.
  init_collective_group(a.world, a.rank, "gloo", "mismatch", options(a));
  std::vector<float> v(a.rank == 0 ? 10 : 12, 1.0f);
  // The first rank to time out aborts the group and resets its connections, so the other may
  // see that (kRemoteError, or kIoError) before its own timeout: either way an Error naming the
  // op, never a terminate.
  try {
    allreduce(v, "mismatch");
    throw std::runtime_error("mismatched allreduce succeeded");
  } catch (const Error& e) {
    require(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kIoError ||
                e.code() == ErrorCode::kRemoteError,
            e.what());
    require(std::string(e.what()).find("allreduce #0 on group 'mismatch'") != std::string::npos,
            e.what());
  }
  destroy_collective_group("mismatch");
}

void scenario_exit_without_destroy(const Args& a) {
  init_collective_group(a.world, a.rank, "gloo", "left-open", options(a));
  std::vector<float> v(100, 1.0f);
  allreduce(v, "left-open");
  require(v[0] == static_cast<float>(a.world), "allreduce");
  // Return without destroy: the exit hook tears the group down.
}

void scenario_wrong_world(const Args& a) {
  // Rank 1 believes the world has 3 ranks, rank 0 that it has 2: both fail fast, naming it.
  const int world = a.rank == 1 ? 3 : 2;
  const auto start = Clock::now();
  expect_error([&] { init_collective_group(world, a.rank, "gloo", "wrong-world", options(a)); },
               ErrorCode::kInvalidArgument, "joined with world size");
  require(ms_since(start) < a.timeout.count() / 2.0, "failed fast, not at the timeout");
}

void scenario_gloo_setting(const Args& a) {
  // Rank 1 chooses the ring for every allreduce, rank 0 the default: both fail at init, naming the
  // settings, instead of mixing up each other's bytes at the first allreduce.
  if (a.rank == 1) ::setenv("TUTTI_GLOO_ALLREDUCE", "ring", 1);
  const std::string needle =
      "rank 0's Gloo allreduce setting is 'auto, the direct exchange or doubling up to "
      "131072 bytes', this rank's 'ring'";
  const auto start = Clock::now();
  expect_error([&] { init_collective_group(2, a.rank, "gloo", "gloo-setting", options(a)); },
               a.rank == 1 ? ErrorCode::kInvalidArgument : ErrorCode::kRemoteError, needle);
  require(ms_since(start) < a.timeout.count() / 2.0, "failed fast, not at the timeout");
}

void scenario_claim(const Args& a) {
  // Two processes claim the same rank: one fails fast, the other waits for the real peer.
  try {
    init_collective_group(a.world, a.rank, "gloo", "claimed", options(a));
  } catch (const Error& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "%s: %s\n", e.code() == ErrorCode::kInvalidUsage ? "CLAIMED" : "OTHER",
                 what.c_str());
    if (e.code() == ErrorCode::kInvalidUsage && what.find("already claimed") != std::string::npos) {
      return;
    }
    if (e.code() == ErrorCode::kTimeout) {
      std::fprintf(stderr, "TIMEOUT\n");
      return;
    }
    throw;
  }
  throw std::runtime_error("init succeeded although rank 1 never came");
}

// Rank 0 hosts the store (a tcp:// URL) and its backend fails: the others must fail naming it
// (kRemoteError), not with the store's "connection closed" as rank 0 leaves. With
// "peers" as the extra argument their backend is Gloo, which waits in the store for rank 0's
// addresses while it is made: that wait must end at rank 0's failure too, not at its timeout.
// (The other ranks' backend needs no peer to be made, so they reach the round after it at once.)
class NoPeersBackend : public Backend {
 public:
  const char* name() const override { return "no-peers"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }
  void abort(const std::string&) override {}
};

void scenario_host_fails(const Args& a) {
  static bool peers = false;
  peers = a.backend == "peers";
  register_collective_backend(
      "fails-on-rank-0", [](const BackendContext& ctx) -> std::unique_ptr<Backend> {
        if (ctx.rank == 0) throw Error(ErrorCode::kUnavailable, "nothing to drive on rank 0");
        if (peers) return create_collective_backend("gloo", ctx);
        return std::make_unique<NoPeersBackend>();
      });
  const auto start = Clock::now();
  try {
    init_collective_group(a.world, a.rank, "fails-on-rank-0", "hostfails", options(a));
  } catch (const Error& e) {
    const std::string what = e.what();
    if (a.rank == 0) {
      require(e.code() == ErrorCode::kUnavailable, "rank 0's own error: " + what);
    } else {
      require(e.code() == ErrorCode::kRemoteError &&
                  what.find("failed on rank 0: nothing to drive on rank 0") != std::string::npos,
              "names rank 0's failure: " + what);
      require(ms_since(start) < 5000, "failed within 5 s of rank 0 (timeout 20 s): " + what);
    }
    std::printf("rank %d: %s\n", a.rank, what.c_str());
    return;
  }
  throw std::runtime_error("init succeeded although rank 0's backend failed");
}

// Launched by tutti-run, torchrun-, Slurm- or Open MPI-style variables: everything from env://.
void scenario_env_allreduce(const Args&) {
  init_collective_group_from_env("", "from-env");
  const int rank = get_rank("from-env");
  const int world = get_collective_group_size("from-env");
  std::vector<int64_t> v(257, rank + 1);
  allreduce(v, "from-env");
  for (int64_t x : v) require(x == int64_t(world) * (world + 1) / 2, "env allreduce sum");
  std::printf("env rank %d of %d local %d/%d: sum %lld, backend '%s'\n", rank, world, local_rank(),
              local_world_size(), static_cast<long long>(v[0]),
              get_group("from-env")->backend_name().c_str());
  destroy_collective_group("from-env");
}

// From env://: one allreduce, then a ready file (TUTTI_TEST_READY_DIR/rank<r>), then allreduces
// with a 3 s timeout (TUTTI_TEST_OP_TIMEOUT_MS) until the test cuts the network: the failure must
// be a tutti::Error naming the op and the group, within the timeout.
void scenario_env_until_cut(const Args&) {
  init_collective_group_from_env("", "cut");
  const int rank = get_rank("cut");
  std::vector<float> v(1024, 1.0f);
  allreduce(v, "cut");
  const char* dir = std::getenv("TUTTI_TEST_READY_DIR");
  require(dir != nullptr, "TUTTI_TEST_READY_DIR is set");
  std::fclose(std::fopen((std::string(dir) + "/rank" + std::to_string(rank)).c_str(), "w"));
  AllreduceOptions opts;
  const char* op_ms = std::getenv("TUTTI_TEST_OP_TIMEOUT_MS");
  opts.timeout = std::chrono::milliseconds(op_ms != nullptr ? std::atol(op_ms) : 3000);
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(60)) {
    Clock::time_point t0 = Clock::now();
    try {
      get_group("cut")->allreduce(v, opts);
    } catch (const Error& e) {
      require(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kIoError,
              std::string("a timeout or I/O error, got: ") + e.what());
      require(std::string(e.what()).find("on group 'cut'") != std::string::npos, e.what());
      std::printf("CUT after %.0f ms, %s: %s\n", ms_since(t0), to_string(e.code()), e.what());
      return;  // exits without destroy: the exit hook must not hang on the dead peer
    }
  }
  throw std::runtime_error("no error within 60 s of allreduces");
}

// From env:// (TUTTI_BACKEND picks the backend): prints which backend the group got, checks an
// allreduce. With TUTTI_TEST_CRASH_RANK=r, rank r then crashes (SIGABRT) and the others' next
// allreduce must fail naming it: "rank r (pid P) died" (kIoError), or, where the other survivor
// noticed first, "rank q aborted the group: ... rank r (pid P) died" (kRemoteError).
void scenario_env_backend(const Args&) {
  init_collective_group_from_env("", "which");
  auto group = get_group("which");
  const int rank = group->rank(), world = group->world_size();
  std::printf("rank %d backend %s\n", rank, group->backend_name().c_str());
  std::vector<int32_t> v(100000, rank + 1);
  allreduce(v, "which");
  for (int32_t x : v) require(x == world * (world + 1) / 2, "allreduce sum");
  const char* crash = std::getenv("TUTTI_TEST_CRASH_RANK");
  if (crash == nullptr) return;
  // The dying rank writes when it died, where TUTTI_TEST_DEATH names a file: the others time
  // their failure from it (from their own op's start, the dying rank's way to its abort, late on
  // a loaded machine, would count too).
  const char* death = std::getenv("TUTTI_TEST_DEATH");
  if (std::atoi(crash) == rank) {
    if (death != nullptr) write_time(death, Clock::now());
    std::abort();
  }
  AllreduceOptions opts;
  opts.timeout = std::chrono::milliseconds(1500);
  const auto start = Clock::now();
  int64_t failed = 0;
  try {
    group->allreduce(v, opts);
    throw std::runtime_error("allreduce succeeded with a dead rank");
  } catch (const Error& e) {
    failed = micros(Clock::now());
    const std::string what = e.what();
    const std::string died = std::string("rank ") + crash + " (pid ";
    require(what.find(died) != std::string::npos && what.find(") died") != std::string::npos,
            "error names the dead rank: " + what);
    require(e.code() == ErrorCode::kIoError || e.code() == ErrorCode::kRemoteError,
            "error code is I/O or remote: " + what);
  }
  std::printf("rank %d: failed after %.0f ms naming rank %s\n", rank, ms_since(start), crash);
  if (death != nullptr) {
    const int64_t died = read_time(death);
    require(died >= 0, std::string("the dying rank wrote ") + death);
    std::printf("rank %d: failed %.1f ms after the death\n", rank,
                static_cast<double>(failed - died) / 1000.0);
  }
}

// Rank TUTTI_TEST_CRASH_RANK crashes (SIGABRT) after a first allreduce; every other rank's next
// allreduce (timeout 20 s) must fail within 5 s with an I/O, remote or abort error, which it
// prints: however many levels stand between a rank and the dead one (hier), it learns of the
// death from its neighbours, never at its timeout.
void scenario_env_crash_noticed(const Args&) {
  init_collective_group_from_env("", "crash");
  auto g = get_group("crash");
  const int rank = g->rank();
  const int crash = std::atoi(std::getenv("TUTTI_TEST_CRASH_RANK"));
  std::vector<int32_t> v(50000, rank + 1);
  g->allreduce(v);
  require(v[0] == g->world_size() * (g->world_size() + 1) / 2, "first allreduce");
  if (rank == crash) std::abort();
  AllreduceOptions opts;
  opts.timeout = std::chrono::milliseconds(20000);
  const auto start = Clock::now();
  try {
    g->allreduce(v, opts);
    throw std::runtime_error("allreduce succeeded with a dead rank");
  } catch (const Error& e) {
    require(e.code() == ErrorCode::kIoError || e.code() == ErrorCode::kRemoteError ||
                e.code() == ErrorCode::kAborted,
            std::string("error code ") + to_string(e.code()) + ": " + e.what());
    require(ms_since(start) < 5000, "noticed within 5 s: " + std::string(e.what()));
    std::printf("rank %d noticed in %.0f ms: %s\n", rank, ms_since(start), e.what());
  }
}

// Rank TUTTI_TEST_SILENT_RANK never calls the allreduce (it waits 4 s, then leaves); rank
// TUTTI_TEST_LATE_RANK calls it 300 ms late. Every other rank's allreduce (timeout 900 ms) must
// fail with kTimeout (or kRemoteError quoting a peer's timeout) no sooner than 900 ms after the
// first rank's op began and within 3 s of its own call, and its message must give the op's
// timeout, 900 ms (under hier a level that began late has less of it left), which it prints.
void scenario_env_silent_rank(const Args&) {
  init_collective_group_from_env("", "silent");
  auto g = get_group("silent");
  const int rank = g->rank();
  std::vector<int32_t> v(1000, rank + 1);
  g->allreduce(v);  // everyone is there
  require(v[0] == g->world_size() * (g->world_size() + 1) / 2, "first allreduce");
  if (rank == std::atoi(std::getenv("TUTTI_TEST_SILENT_RANK"))) {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    std::fflush(stdout);
    std::_Exit(0);  // its peers have failed by now; no teardown that waits for them
  }
  const bool late = rank == std::atoi(std::getenv("TUTTI_TEST_LATE_RANK"));
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  AllreduceOptions opts;
  opts.timeout = std::chrono::milliseconds(900);
  // Each rank writes when its op began, where the others read it once they have failed.
  const std::string starts = std::getenv("TUTTI_TEST_STARTS");
  const auto start = Clock::now();
  write_time(starts + "/start-" + std::to_string(rank), start);
  try {
    g->allreduce(v, opts);
    throw std::runtime_error("allreduce succeeded without the silent rank");
  } catch (const Error& e) {
    const auto failed = Clock::now();
    const double ms = ms_since(start);
    // kRemoteError: a rank that learned of the timeout from a peer (hier: a host's leader).
    require(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kRemoteError,
            std::string("error code ") + to_string(e.code()) + ": " + e.what());
    // No rank fails before some rank's op reached its 900 ms: the earliest start of those that
    // are in the op (each wrote it before its op began, so before any timeout of its).
    int64_t first = micros(start);
    for (int r = 0; r < g->world_size(); ++r) {
      const int64_t t = read_time(starts + "/start-" + std::to_string(r));
      if (t >= 0) first = std::min(first, t);  // none from the silent rank
    }
    const double after_first = static_cast<double>(micros(failed) - first) / 1000.0;
    require(after_first >= 900 && ms < 3000,
            "failed " + std::to_string(after_first) + " ms after the first rank's op began, " +
                std::to_string(ms) + " ms after its own: " + e.what());
    require(std::string(e.what()).find("900 ms") != std::string::npos,
            std::string("the op's timeout named: ") + e.what());
    std::printf("rank %d timed out in %.0f ms (%.0f ms after the first rank began): %s\n", rank, ms,
                after_first, e.what());
  }
}

// Ranks 0 and 1 exchange 1 MiB each way (send, recv), checked; prints "p2p checked".
void scenario_env_sendrecv(const Args&) {
  init_collective_group_from_env("", "p2p");
  auto g = get_group("p2p");
  const int rank = g->rank();
  std::vector<float> v(1 << 18, static_cast<float>(rank + 1));
  if (rank == 0) {
    g->send(v, 1);
    g->recv(v, 1);
    require(v[(1 << 18) - 1] == 2.0f, "received rank 1's values");
  } else if (rank == 1) {
    std::vector<float> got(1 << 18);
    g->recv(got, 0);
    require(got[0] == 1.0f, "received rank 0's values");
    g->send(v, 0);
  }
  std::printf("rank %d: p2p checked\n", rank);
}

// Every op on the group the environment describes, each result checked against values computed
// here from the ranks' inputs: what the hier backend must get right on any layout of hosts
// (its composed allreduce, broadcast and barrier, and the ops it hands to the flat level).
// allreduce and broadcast of tensors in symmetric memory (allocate_symmetric) on the group the
// environment describes (hier: the host levels' single-copy paths), checked; prints whether the
// memory is symmetric. Rank TUTTI_TEST_SYMMETRIC_FSIZE_RANK cannot make its part: its files may
// not grow past 1 MiB while it allocates (RLIMIT_FSIZE; the 1.2 MB region's reservation fails).
void scenario_env_symmetric(const Args&) {
  init_collective_group_from_env("", "sym");
  auto g = get_group("sym");
  const int rank = g->rank(), world = g->world_size();
  const size_t n = 300001;
  const char* fsize = std::getenv("TUTTI_TEST_SYMMETRIC_FSIZE_RANK");
  const bool limited = fsize != nullptr && std::atoi(fsize) == rank;
  rlimit was{};
  if (limited) {
    ::signal(SIGXFSZ, SIG_IGN);  // the failing call's errno (EFBIG), not the signal
    ::getrlimit(RLIMIT_FSIZE, &was);
    rlimit small = was;
    small.rlim_cur = 1 << 20;
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  auto mem = g->allocate_symmetric(n * sizeof(float));
  if (limited) ::setrlimit(RLIMIT_FSIZE, &was);
  std::printf("rank %d backend %s symmetric %d\n", rank, g->backend_name().c_str(),
              mem->symmetric() ? 1 : 0);
  float* v = static_cast<float*>(mem->data());
  for (int rep = 0; rep < 2; ++rep) {
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * (i % 5 + 1));
    g->allreduce(TensorView(v, DType::kFloat32, {static_cast<int64_t>(n)}));
    for (size_t i = 0; i < n; ++i) {
      require(v[i] == static_cast<float>(world * (world + 1) / 2 * (i % 5 + 1)), "allreduce sum");
    }
    BroadcastOptions bo;
    bo.root_rank = world - 1;
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 1000 + i % 3);
    g->broadcast(TensorView(v, DType::kFloat32, {static_cast<int64_t>(n)}), bo);
    for (size_t i = 0; i < n; ++i) {
      require(v[i] == static_cast<float>((world - 1) * 1000 + i % 3), "broadcast");
    }
  }
  g->barrier();
  std::printf("rank %d: symmetric ops checked\n", rank);
}

// A rank as its own process: the slice its main thread had before and after a few 4 KiB
// allreduces (shm's waits ask for short slices where the group's ranks outnumber their CPUs).
void scenario_env_slice(const Args&) {
  const uint64_t before = shm_backend::current_slice_ns();
  init_collective_group_from_env("", "slice");
  auto group = get_group("slice");
  const int rank = group->rank(), world = group->world_size();
  std::vector<float> v(1024);
  for (int i = 0; i < 10; ++i) {
    std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
    allreduce(v, "slice");
    require(v[1023] == static_cast<float>(world * (world + 1) / 2), "allreduce sum");
  }
  std::printf("rank %d backend %s slice before %llu after %llu\n", rank,
              group->backend_name().c_str(), static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(shm_backend::current_slice_ns()));
}

void scenario_env_every_op(const Args&) {
  init_collective_group_from_env("", "every");
  auto g = get_group("every");
  const int rank = g->rank(), world = g->world_size();
  std::printf("rank %d backend %s\n", rank, g->backend_name().c_str());
  for (size_t n : {size_t{5}, size_t{70000}}) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = (rank + 1) * static_cast<int32_t>(i % 7 + 1);
    g->allreduce(v);
    for (size_t i = 0; i < n; ++i) {
      require(v[i] == world * (world + 1) / 2 * static_cast<int32_t>(i % 7 + 1), "allreduce sum");
    }
    std::vector<int64_t> m(n);
    for (size_t i = 0; i < n; ++i) m[i] = static_cast<int64_t>((rank * 31 + i) % 17);
    AllreduceOptions mo;
    mo.reduce_op = ReduceOp::kMax;
    g->allreduce(m, mo);
    for (size_t i = 0; i < n; ++i) {
      int64_t want = 0;
      for (int r = 0; r < world; ++r) want = std::max<int64_t>(want, (r * 31 + i) % 17);
      require(m[i] == want, "allreduce max");
    }
    std::vector<float> f(n, static_cast<float>(rank + 1));
    AllreduceOptions ao;
    ao.reduce_op = ReduceOp::kAvg;
    g->allreduce(f, ao);
    for (float x : f) require(x == (world + 1) / 2.0f, "allreduce avg");
  }
  std::vector<int64_t> p(3, 2);
  AllreduceOptions po;
  po.reduce_op = ReduceOp::kProduct;
  g->allreduce(p, po);
  require(p[2] == (int64_t{1} << world), "allreduce product");
  for (int root = 0; root < world; ++root) {
    std::vector<int32_t> b(1000, rank == root ? 100 + root : -1);
    BroadcastOptions bo;
    bo.root_rank = root;
    g->broadcast(b, bo);
    for (int32_t x : b) require(x == 100 + root, "broadcast from rank " + std::to_string(root));
    g->barrier();
  }
  std::vector<int32_t> red(10, rank + 1);
  ReduceOptions ro;
  ro.root_rank = world - 1;
  g->reduce(red, ro);
  if (rank == world - 1) require(red[9] == world * (world + 1) / 2, "reduce");
  std::vector<int32_t> mine(4), all(4 * static_cast<size_t>(world));
  for (int j = 0; j < 4; ++j) mine[j] = rank * 10 + j;
  g->allgather(TensorView(all), TensorView(mine));
  for (int r = 0; r < world; ++r) {
    for (int j = 0; j < 4; ++j) require(all[r * 4 + j] == r * 10 + j, "allgather");
  }
  if (world > 1) {
    std::vector<int32_t> out(8, rank), in(8, -1);
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    g->batch_isend_irecv({P2POp::send(out, next), P2POp::recv(in, prev)})->wait();
    for (int32_t x : in) require(x == prev, "send and receive around the ring");
  }
  // A subgroup of one rank inherits the backend only where it suits its hosts: hier does not
  // suit one host, so that subgroup takes what "auto" takes there (shm).
  auto alone = g->split({0});
  if (rank == 0) {
    require(alone != nullptr, "rank 0's subgroup");
    require(g->backend_name() != "hier" || alone->backend_name() == "shm",
            "a one-rank split of a hier group is shm, got " + alone->backend_name());
    std::vector<int32_t> one(3, 7);
    alone->allreduce(one);
    require(one[2] == 7, "allreduce on a subgroup of one");
  }
  destroy_collective_group("every");
  std::printf("rank %d: every op checked\n", rank);
}

// World 2. Each rank waits in a receive from the other, so neither op can complete (op timeout
// 20 s; not an allreduce against a receive: on gloo both take the same connection, and the
// receive would fail at once on the allreduce's header); another thread of rank 0 destroys the
// group 300 ms in. Rank 0's op must end with kAborted, rank 1's with an error naming rank 0 (shm:
// the abort word; gloo: rank 0's connections reset), both long before the timeout. Then both ranks
// initialise the group again under the same name and an allreduce works.
void scenario_abort_mid_op(const Args& a) {
  require(a.world == 2, "the abort_mid_op scenario runs with 2 ranks");
  const std::string name = "abortee";
  init_collective_group(2, a.rank, a.backend, name, options(a));
  std::vector<int32_t> v(100000, a.rank + 1);
  allreduce(v, name);
  require(v[0] == 3, "first allreduce");
  if (a.rank == 0) {
    auto group = get_group(name);
    std::string error;
    ErrorCode code = ErrorCode::kInternal;
    double op_ms = 0;
    std::thread op([&] {
      const auto start = Clock::now();
      try {
        group->issue_from_this_thread();  // the main thread created the group
        group->recv(v, 1);
      } catch (const Error& e) {
        error = e.what();
        code = e.code();
      }
      op_ms = ms_since(start);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = Clock::now();
    destroy_collective_group(name);
    const double destroy_ms = ms_since(start);
    op.join();
    std::printf("rank 0: destroy took %.1f ms; the op ended after %.1f ms: %s\n", destroy_ms, op_ms,
                error.c_str());
    require(code == ErrorCode::kAborted, "the op ended with kAborted: " + error);
    require(op_ms < 300 + 2000, "the op ended promptly after destroy");
  } else {
    const auto start = Clock::now();
    try {
      get_group(name)->recv(v, 0);
      throw std::runtime_error("a receive succeeded while rank 0 waited in a receive");
    } catch (const Error& e) {
      const double ms = ms_since(start);
      std::printf("rank 1: failed after %.1f ms: %s\n", ms, e.what());
      require(e.code() == ErrorCode::kRemoteError || e.code() == ErrorCode::kIoError,
              std::string("remote or I/O error: ") + e.what());
      require(std::string(e.what()).find("rank 0") != std::string::npos,
              std::string("names rank 0: ") + e.what());
      require(ms < 5000, "failed long before the 20 s timeout");
    }
    destroy_collective_group(name);
  }
  // Again, under the same name.
  init_collective_group(2, a.rank, a.backend, name, options(a));
  std::vector<int32_t> w(1000, a.rank + 1);
  allreduce(w, name);
  require(w[999] == 3, "allreduce after re-creating the group");
  destroy_collective_group(name);
}

}  // namespace

int main(int argc, char** argv) {
  // Scenarios launched through an environment (tutti-run, torchrun-style variables) take no
  // positional arguments; the others take rank, world size, store URL and a timeout.
  const std::map<std::string, void (*)(const Args&)> from_env = {
      {"env_allreduce", scenario_env_allreduce},
      {"env_until_cut", scenario_env_until_cut},
      {"env_backend", scenario_env_backend},
      {"env_every_op", scenario_env_every_op},
      {"env_slice", scenario_env_slice},
      {"env_symmetric", scenario_env_symmetric},
      {"env_crash_noticed", scenario_env_crash_noticed},
      {"env_silent_rank", scenario_env_silent_rank},
      {"env_sendrecv", scenario_env_sendrecv},
  };
  const std::map<std::string, void (*)(const Args&)> positional = {
      {"allreduce", scenario_allreduce},
      {"ray", scenario_ray},
      {"never_arrive", scenario_never_arrive},
      {"host_gone", scenario_host_gone},
      {"caller_store", scenario_caller_store},
      {"caller_store_shrunk", scenario_caller_store_shrunk},
      {"op_timeout", scenario_op_timeout},
      {"mismatch", scenario_mismatch},
      {"exit_without_destroy", scenario_exit_without_destroy},
      {"claim", scenario_claim},
      {"host_fails", scenario_host_fails},
      {"wrong_world", scenario_wrong_world},
      {"gloo_setting", scenario_gloo_setting},
      {"abort_mid_op", scenario_abort_mid_op},
  };
  const std::string scenario = argc >= 2 ? argv[1] : "";
  Args a;
  void (*run)(const Args&) = nullptr;
  if (auto it = from_env.find(scenario); it != from_env.end()) {
    run = it->second;
    a.rank = -1;  // the scenario learns it from the environment
  } else if (auto it = positional.find(scenario); it != positional.end()) {
    if (argc < 5) {
      std::fprintf(stderr, "usage: %s <scenario> <rank> <world_size> <store_url> [timeout_ms]\n",
                   argv[0]);
      return 2;
    }
    run = it->second;
    a.rank = std::atoi(argv[2]);
    a.world = std::atoi(argv[3]);
    a.store_url = argv[4];
    if (argc > 5) a.timeout = std::chrono::milliseconds(std::atoi(argv[5]));
    if (argc > 6) a.backend = argv[6];
  } else {
    std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
    return 2;
  }
  try {
    run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d FAILED: %s\n", a.rank, e.what());
    return 1;
  }
  if (a.rank >= 0) std::fprintf(stderr, "rank %d OK\n", a.rank);
  return 0;
}
