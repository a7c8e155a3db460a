// A rank of a fault-injection scenario (tests/fault_test.cc), started as a real process:
//   tutti_fault_worker <scenario> <rank> <world_size> <store_url> [key=value...]
// Keys: backend (gloo), timeout (ms, the group's), name (the group's), and what a scenario reads.
// Exits 0 when every check of the scenario held, 1 with a message on stderr otherwise. Lines
// "FIGURE <what> <value>" report measurements to the test (and to docs/RELIABILITY.md).
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "sanitizers.h"

#include "tutti/tutti.h"

using namespace tutti;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

struct Args {
  std::string scenario;
  int rank = 0;
  int world = 1;
  std::string store_url;
  std::map<std::string, std::string> kv;

  std::string get(const std::string& key, const std::string& fallback = "") const {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : it->second;
  }
  long num(const std::string& key, long fallback) const {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : std::atol(it->second.c_str());
  }
  std::string backend() const { return get("backend", "gloo"); }
  std::string name() const { return get("name", "faulty"); }
  milliseconds timeout() const {
    return get("timeout") == "max" ? milliseconds::max() : milliseconds(num("timeout", 10000));
  }
  GroupOptions options() const {
    GroupOptions o;
    o.store_url = store_url;
    o.timeout = timeout();
    return o;
  }
};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Runs fn, which must throw a tutti::Error with one of `codes` and every needle in its message.
Error expect_error(const std::function<void()>& fn, std::vector<ErrorCode> codes,
                   const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    bool code_ok = false;
    for (ErrorCode c : codes) code_ok |= e.code() == c;
    require(code_ok, std::string("unexpected error code ") + to_string(e.code()) + ": " + what);
    for (const auto& n : needles) {
      require(what.find(n) != std::string::npos, "message lacks '" + n + "': " + what);
    }
    std::fprintf(stderr, "expected error: %s\n", what.c_str());
    return e;
  }
  throw std::runtime_error("expected a tutti::Error, the call succeeded");
}

// Waits for a child process at most `limit`; its exit code, 128 + signal, or -1 on overrun
// (then it is killed).
int wait_child(pid_t pid, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// fork (A.1, A.2, A.3): rank 0 forks while its peer waits in an allreduce. The child's ops fail
// with kInvalidUsage before any I/O, its destroy and its exit return at once, and it may create
// groups of its own; the parent's groups keep working with the right data, through several
// children (one destroys the inherited group, one leaves it to the exit hook).
// ---------------------------------------------------------------------------------------------
int child_of_fork(bool destroy_first) {
  ::alarm(10);  // a hang in the child shows as SIGALRM, not as a stuck test
  try {
    const std::string name = "forked";
    std::vector<float> v(1000, 100.0f);
    expect_error([&] { allreduce(v, name); }, {ErrorCode::kInvalidUsage},
                 {"allreduce on group 'forked' (rank 0/2)", "belongs to the parent process",
                  "fork before creating groups"});
    expect_error([&] { get_group(name)->barrier(); }, {ErrorCode::kInvalidUsage},
                 {"belongs to the parent process"});
    // A group of the child's own works.
    init_collective_group(1, 0, "gloo", "child-own");
    std::vector<int32_t> w(4, 7);
    allreduce(w, "child-own");
    require(w[0] == 7, "the child's own group");
    destroy_collective_group("child-own");
    if (destroy_first) {
      const auto start = Clock::now();
      destroy_collective_group(name);
      require(ms_since(start) < 1000, "the child's destroy returned at once");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child FAILED: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::fflush(stderr);
  std::exit(0);  // through the exit hook, which must skip the parent's resources
}

void scenario_fork(const Args& a) {
  require(a.world == 2, "fork runs with 2 ranks");
  const std::string name = "forked";
  auto store = open_store(a.store_url, milliseconds(30000));
  init_collective_group(2, a.rank, a.backend(), name, a.options());
  for (int round = 0; round < 3; ++round) {
    const std::string phase = "round" + std::to_string(round);
    std::vector<float> v(1000, static_cast<float>(a.rank + 1 + 10 * round));
    const float want = static_cast<float>(3 + 20 * round);
    if (a.rank == 1) {
      // Waits in the allreduce while rank 0's child tries to take part in it.
      store->set(phase + "/rank1-calls", "1");
      allreduce(v, name);
    } else {
      store->wait({phase + "/rank1-calls"});
      std::this_thread::sleep_for(milliseconds(50));  // rank 1 is inside its allreduce
      const pid_t pid = ::fork();
      require(pid >= 0, "fork");
      if (pid == 0) child_of_fork(/*destroy_first=*/round % 2 == 0);
      const int status = wait_child(pid, milliseconds(15000));
      require(status == 0, "the child ended with status " + std::to_string(status) +
                               " (142: SIGALRM, a hang; -1: overran)");
      allreduce(v, name);
    }
    for (float x : v) require(x == want, "allreduce after a fork: " + std::to_string(x));
  }
  // More ops after the children are gone: the parent's connections and segment are intact.
  for (int i = 0; i < 20; ++i) {
    std::vector<int64_t> w(70000, a.rank + i);
    allreduce(w, name);
    for (int64_t x : {w[0], w[69999]}) require(x == 2 * i + 1, "allreduce after the children");
  }
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// threads (A.4): two threads each issue 200 same-signature allreduces on one group at once.
// Thread t of rank r contributes 1000 t + r + 1, so each thread knows its right sum; a result
// that is anything else is another thread's data. Errors are fine, wrong data is not.
// ---------------------------------------------------------------------------------------------
struct ThreadTally {
  int right = 0, wrong = 0, refused = 0, other = 0;
};

ThreadTally hammer(CollectiveGroup& g, int t, int world, int iterations, bool take_over) {
  ThreadTally tally;
  if (take_over) g.issue_from_this_thread();
  const int32_t want = 1000 * t * world + world * (world + 1) / 2;
  for (int i = 0; i < iterations; ++i) {
    std::vector<int32_t> v(256, 1000 * t + g.rank() + 1);
    try {
      g.allreduce(v);
      bool ok = true;
      for (int32_t x : v) ok &= x == want;
      (ok ? tally.right : tally.wrong)++;
    } catch (const Error& e) {
      (e.code() == ErrorCode::kInvalidUsage ? tally.refused : tally.other)++;
    }
  }
  return tally;
}

void scenario_threads(const Args& a) {
  const std::string name = a.name();
  init_collective_group(a.world, a.rank, a.backend(), name, a.options());
  auto g = get_group(name);
  const int n = static_cast<int>(a.num("iterations", 200));
  // 1. Two threads at once on a group the main thread created: both are refused, never mixed.
  {
    ThreadTally t0, t1;
    std::thread x([&] { t0 = hammer(*g, 0, a.world, n, false); });
    std::thread y([&] { t1 = hammer(*g, 1, a.world, n, false); });
    x.join();
    y.join();
    std::printf("FIGURE threads-%s two-threads right=%d wrong=%d refused=%d other=%d\n",
                a.backend().c_str(), t0.right + t1.right, t0.wrong + t1.wrong,
                t0.refused + t1.refused, t0.other + t1.other);
    require(t0.wrong + t1.wrong == 0, "no thread got another thread's data");
    require(t0.other + t1.other == 0, "refusals only (kInvalidUsage), no failed op");
  }
  // 2. One thread takes the group over while the other keeps trying: the first gets every
  //    result right, the second is refused every time. Once the first has ended, a single
  //    thread takes the group over by issuing an op.
  {
    ThreadTally t0, t1, t2;
    std::atomic<int> step{0};
    std::thread x([&] {
      g->issue_from_this_thread();
      step = 1;
      t0 = hammer(*g, 0, a.world, n, false);
      while (step != 2) std::this_thread::sleep_for(milliseconds(1));  // y is done
    });
    while (step != 1) std::this_thread::sleep_for(milliseconds(1));
    std::thread y([&] {
      t1 = hammer(*g, 1, a.world, n, false);
      step = 2;
    });
    x.join();
    y.join();
    std::thread z([&] { t2 = hammer(*g, 1, a.world, n / 4, false); });
    z.join();
    std::printf(
        "FIGURE threads-%s takeover x=%d/%d/%d/%d y=%d/%d/%d/%d z=%d/%d/%d/%d "
        "(right/wrong/refused/other)\n",
        a.backend().c_str(), t0.right, t0.wrong, t0.refused, t0.other, t1.right, t1.wrong,
        t1.refused, t1.other, t2.right, t2.wrong, t2.refused, t2.other);
    require(t0.right == n, "the thread that took the group over: all right");
    require(t1.refused == n, "the other thread: refused while x held the group");
    require(t2.right == n / 4, "the thread that came after: all right");
  }
  // 3. Async ops from one thread stay fine.
  {
    g->issue_from_this_thread();
    std::vector<std::vector<int32_t>> bufs(50, std::vector<int32_t>(300, a.rank + 1));
    std::vector<std::shared_ptr<Work>> works;
    AllreduceOptions o;
    o.async_op = true;
    for (auto& b : bufs) works.push_back(g->allreduce(b, o));
    for (auto& w : works) w->wait();
    for (auto& b : bufs) require(b[299] == a.world * (a.world + 1) / 2, "async allreduce");
  }
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// flight: the flight recorder. Five allreduces, then rank 2 stops taking part: it asks for a
// dump on demand (SIGUSR1) while ranks 0 and 1 time out in allreduce #5, which dumps theirs.
// The test then runs tutti-flight over the directory.
// ---------------------------------------------------------------------------------------------
std::vector<std::string> files_in(const std::string& dir, const std::string& needle) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.find(needle) != std::string::npos) out.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  return out;
}

void scenario_flight(const Args& a) {
  require(a.world == 3, "flight runs with 3 ranks");
  const std::string dir = a.get("dir");
  ::setenv("TUTTI_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  const std::string name = a.name();
  auto store = open_store(a.store_url, milliseconds(30000));
  init_collective_group(3, a.rank, a.backend(), name, a.options());
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(1000, 1.0f);
    allreduce(v, name);
    require(v[0] == 3.0f, "allreduce");
  }
  if (a.rank == 2) {
    ::raise(SIGUSR1);
    const auto start = Clock::now();
    std::vector<std::string> mine;
    while (ms_since(start) < 5000 && (mine = files_in(dir, ".rank2.txt")).empty()) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    require(!mine.empty(), "SIGUSR1 wrote rank 2's dump");
    std::printf("FIGURE flight-%s signal dump after %.1f ms\n", a.backend().c_str(),
                ms_since(start));
    store->wait({"timed-out/0", "timed-out/1"});
  } else {
    std::vector<float> v(1000, 1.0f);
    expect_error([&] { allreduce(v, name); },
                 {ErrorCode::kTimeout, ErrorCode::kRemoteError, ErrorCode::kIoError},
                 {"allreduce #5"});
    // The abort dumped this rank's record.
    require(!files_in(dir, ".rank" + std::to_string(a.rank) + ".txt").empty(),
            "the abort wrote this rank's dump");
    store->set("timed-out/" + std::to_string(a.rank), "1");
  }
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// crash (world 3): every rank loops allreduces of `size` int32; a few ops in, rank 2 dies in the
// middle of one (how = kill: SIGKILL, term: SIGTERM, exit: exit(1) from another thread, abort:
// abort()). The survivors must fail with an error naming a rank within `bound` ms of the death
// (not at the 20 s op timeout), never be killed (SIGPIPE included: it is at its default here,
// as tutti-run leaves it), then re-create the group under the same name with a restarted
// rank 2 (which rank 0 starts) and get the right sum.
// ---------------------------------------------------------------------------------------------
int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void die(const std::string& how) {
  if (how == "kill") ::raise(SIGKILL);
  if (how == "term") ::raise(SIGTERM);
  if (how == "exit") std::exit(1);
  std::abort();
}

// Rank 2 of the group again, after the crash.
// The crash scenario's groups: `timeout` bounds each op, the group's own (its rendezvous) is
// 30 s, so that re-creating waits for a survivor that was slow to fail.
GroupOptions crash_options(const Args& a) {
  GroupOptions o = a.options();
  o.timeout = std::chrono::seconds(30);
  return o;
}

void scenario_rejoin(const Args& a) {
  init_collective_group(a.world, a.rank, a.backend(), a.name(), crash_options(a));
  std::vector<int32_t> v(1000, a.rank + 1);
  allreduce(v, a.name());
  require(v[999] == a.world * (a.world + 1) / 2, "allreduce after re-creating the group");
  destroy_collective_group(a.name());
}

void scenario_crash(const Args& a) {
  require(a.world == 3, "crash runs with 3 ranks");
  ::signal(SIGPIPE, SIG_DFL);  // what tutti-run gives its ranks
  const std::string name = a.name(), how = a.get("how", "kill");
  const int64_t size = a.num("size", 262144);
  const double bound = static_cast<double>(a.num("bound", 2000));
  auto store = open_store(a.store_url, milliseconds(30000));
  init_collective_group(3, a.rank, a.backend(), name, crash_options(a));
  auto group = get_group(name);
  // The op in the loop (`op=`): allreduce (default), broadcast, reduce (root 0), allgather,
  // reduce_scatter, or batch_isend_irecv round the ring (send to the right, receive from the
  // left), each checked against the sums and values it must give.
  const std::string op = a.get("op", "allreduce");
  require(op == "allreduce" || op == "broadcast" || op == "reduce" || op == "allgather" ||
              op == "reduce_scatter" || op == "batch_isend_irecv",
          "op=" + op + " is not one the crash scenario runs");
  if (a.rank == 2) {
    std::thread([&a, how] {
      std::this_thread::sleep_for(milliseconds(20 + ::getpid() % 7));
      auto mine = open_store(a.store_url, milliseconds(5000));
      mine->set("dying_us", std::to_string(wall_us()));
      die(how);
    }).detach();
  }
  std::vector<int32_t> v(static_cast<size_t>(size));
  std::vector<int32_t> all(static_cast<size_t>(size) *
                           3);  // allgather's output, reduce_scatter's input
  // One op of the loop; then what every element of its output must be (an independent formula:
  // rank r contributes r + 1), checked at the first and last element of each block.
  auto run_op = [&] {
    auto with_timeout = [&a](auto options) {
      options.timeout = a.timeout();
      return options;
    };
    if (op == "allreduce") {
      group->allreduce(v, with_timeout(AllreduceOptions{}));
    } else if (op == "broadcast") {
      group->broadcast(v, with_timeout(BroadcastOptions{}));
    } else if (op == "reduce") {
      group->reduce(v, with_timeout(ReduceOptions{}));
    } else if (op == "allgather") {
      group->allgather(all, v, with_timeout(AllgatherOptions{}));
    } else if (op == "batch_isend_irecv") {
      // all's first block receives from the left.
      TensorView from_left(all.data(), DType::kInt32, {static_cast<int64_t>(v.size())});
      group
          ->batch_isend_irecv(
              {P2POp::send(v, (a.rank + 1) % 3), P2POp::recv(from_left, (a.rank + 2) % 3)},
              with_timeout(BatchP2POptions{}))
          ->wait();
    } else {
      group->reduce_scatter(v, all, with_timeout(ReduceScatterOptions{}));
    }
  };
  auto check = [&] {
    auto ends = [](const int32_t* p, size_t n) { return std::make_pair(p[0], p[n - 1]); };
    const size_t n = v.size();
    if (op == "allgather") {
      for (int r = 0; r < 3; ++r) {
        const auto [first, last] = ends(all.data() + r * n, n);
        require(first == r + 1 && last == r + 1, "allgather block " + std::to_string(r));
      }
      return;
    }
    if (op == "batch_isend_irecv") {
      const auto [first, last] = ends(all.data(), n);
      const int32_t left = (a.rank + 2) % 3 + 1;
      require(first == left && last == left, "received " + std::to_string(first));
      return;
    }
    const int32_t want = op == "broadcast" ? 1 : op == "reduce" && a.rank != 0 ? a.rank + 1 : 6;
    const auto [first, last] = ends(v.data(), n);
    require(first == want && last == want, op + " result " + std::to_string(first));
  };
  int done = 0;
  while (true) {
    std::fill(v.begin(), v.end(), a.rank + 1);
    std::fill(all.begin(), all.end(), a.rank + 1);
    try {
      run_op();
    } catch (const Error& e) {
      const int64_t failed_us = wall_us();
      if (a.rank == 2) {
        // exit(1): the exit hook destroyed the group under this op. Wait for the end.
        while (true) ::pause();
      }
      const std::string what = e.what();
      std::fprintf(stderr, "rank %d: %s: %s\n", a.rank, to_string(e.code()), what.c_str());
      require(what.find(op + " #") != std::string::npos, "names the op");
      const double ms = (failed_us - std::stoll(store->get("dying_us"))) / 1000.0;
      require(e.code() == ErrorCode::kIoError || e.code() == ErrorCode::kRemoteError,
              "an I/O or remote error");
      require(what.find("rank 2") != std::string::npos ||
                  what.find("rank " + std::to_string(1 - a.rank)) != std::string::npos,
              "names the dead rank, or the survivor that passed its death on");
      std::printf("FIGURE crash %s %s %s rank %d error_after_ms=%.1f code=%s after %d ops: %s\n",
                  a.backend().c_str(), op.c_str(), how.c_str(), a.rank, ms, to_string(e.code()),
                  done, what.c_str());
      require(ms < bound, "failed within " + std::to_string(static_cast<int>(bound)) +
                              " ms of the death, not at the op timeout");
      break;
    }
    check();
    ++done;
    require(done < 100000, "rank 2 never died");
  }
  destroy_collective_group(name);
  // The same name again, with rank 2 restarted.
  pid_t replacement = -1;
  if (a.rank == 0) {
    std::vector<std::string> args = {"/proc/self/exe", "rejoin", "2", "3", a.store_url};
    for (const auto& [k, val] : a.kv) args.push_back(k + "=" + val);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    replacement = ::fork();
    if (replacement == 0) {
      ::execv("/proc/self/exe", argv.data());
      std::_Exit(127);
    }
  }
  const auto start = Clock::now();
  scenario_rejoin(a);
  std::printf("FIGURE crash %s %s rank %d recreated_ms=%.1f\n", a.backend().c_str(), how.c_str(),
              a.rank, ms_since(start));
  if (a.rank == 0) {
    const int status = wait_child(replacement, milliseconds(30000));
    require(status == 0, "the restarted rank 2 ended with status " + std::to_string(status));
  }
}

// ---------------------------------------------------------------------------------------------
// cycles: init, allreduce, destroy, `cycles` times under one name through one store. From the
// `warm`-th cycle on, this process's open fds and threads stay exactly flat, and its resident
// memory within `rss_slack_kb`.
// ---------------------------------------------------------------------------------------------
struct Usage {
  int fds = 0, threads = 0;
  long rss_kb = 0;
};

int entries_in(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

Usage usage() {
  Usage u;
  u.fds = entries_in("/proc/self/fd") - 1;  // the directory being read
  u.threads = entries_in("/proc/self/task");
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  u.rss_kb = resident * (::sysconf(_SC_PAGESIZE) / 1024);
  return u;
}

void scenario_cycles(const Args& a) {
  const std::string name = a.name();
  const int cycles = static_cast<int>(a.num("cycles", 1000));
  const int warm = static_cast<int>(a.num("warm", 100));
  const long slack = a.num("rss_slack_kb", 8192);
  GroupOptions o = a.options();
  o.job_id = a.get("job");
  Usage base;
  const auto start = Clock::now();
  auto warm_at = start;
  for (int c = 0; c < cycles; ++c) {
    if (c == warm) {
      base = usage();
      warm_at = Clock::now();
    }
    init_collective_group(a.world, a.rank, a.backend(), name, o);
    std::vector<int32_t> v(100, a.rank + 1 + c);
    allreduce(v, name);
    const int32_t want = a.world * (a.world + 1) / 2 + a.world * c;
    require(v[0] == want && v[99] == want, "allreduce in cycle " + std::to_string(c));
    destroy_collective_group(name);
  }
  // A store host keeps serving a destroyed group's slower ranks for a moment (the last few
  // cycles' connections, polled every 20 ms): the count settles within a second. So may a thread
  // of the last cycle still be ending, at the end or when the baseline was read (then the end has
  // one thread fewer: seen once in a run of five, rank 1 of gloo through tcp://, 2 -> 1).
  Usage end = usage();
  for (int i = 0; i < 50 && (end.fds > base.fds + 2 || end.threads > base.threads); ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    end = usage();
  }
  const double per_cycle = ms_since(warm_at) / std::max(1, cycles - warm);
  std::printf(
      "FIGURE cycles %s %s rank %d: %d cycles, %.2f ms each; fds %d -> %d, threads %d "
      "-> %d, rss %ld -> %ld kB\n",
      a.backend().c_str(), a.get("store_kind").c_str(), a.rank, cycles, per_cycle, base.fds,
      end.fds, base.threads, end.threads, base.rss_kb, end.rss_kb);
  // The store server closes its side of a departed client's connection on its own thread, so
  // the count at one instant may be off by a socket or two; a leak grows with the cycles.
  require(end.fds <= base.fds + 2, "open fds stay flat");
  require(end.threads <= base.threads, "threads stay flat");
  // Under AddressSanitizer its quarantine grows RSS; LeakSanitizer fails this process at exit
  // for any leak instead.
  if (!tutti::testing::kAddressSanitizer) {
    require(end.rss_kb - base.rss_kb < slack, "resident memory stays flat");
  }
}

// ---------------------------------------------------------------------------------------------
// mismatch (world 2, no op check): rank 1 calls another count, dtype, op or root than rank 0,
// or skips a broadcast. Both fail with a named error within timeout + 2 s, never with rank 0's
// and rank 1's data mixed; the group is destroyed and created again under its name for the next
// case.
// ---------------------------------------------------------------------------------------------
void scenario_mismatch(const Args& a) {
  require(a.world == 2, "mismatch runs with 2 ranks");
  const std::string name = a.name();
  auto store = open_store(a.store_url, milliseconds(30000));
  const std::vector<std::string> kinds = {"count", "dtype", "op", "root", "skip"};
  const bool odd = a.rank == 1;
  for (size_t k = 0; k < kinds.size(); ++k) {
    const std::string& kind = kinds[k];
    init_collective_group(2, a.rank, a.backend(), name, a.options());
    auto g = get_group(name);
    std::vector<float> f(odd && kind == "count" ? 12 : 10, static_cast<float>(a.rank + 1));
    std::vector<int32_t> i32(10, a.rank + 1);
    const auto start = Clock::now();
    try {
      if (kind == "count") {
        g->allreduce(f);
      } else if (kind == "dtype") {
        if (odd)
          g->allreduce(i32);
        else
          g->allreduce(f);
      } else if (kind == "op") {
        if (odd)
          g->broadcast(f);
        else
          g->allreduce(f);
      } else if (kind == "root") {
        BroadcastOptions o;
        o.root_rank = odd ? 1 : 0;
        g->broadcast(f, o);
      } else {
        // Rank 0: allreduce, broadcast, allreduce; rank 1 skips the broadcast.
        g->allreduce(f);
        for (float x : f) require(x == 3.0f, "the allreduce before the skip");
        std::fill(f.begin(), f.end(), static_cast<float>(a.rank + 1));
        if (!odd) g->broadcast(f);
        g->allreduce(f);
      }
      throw std::runtime_error(kind + ": the mismatched op returned OK");
    } catch (const Error& e) {
      const double ms = ms_since(start);
      const std::string what = e.what();
      std::printf("FIGURE mismatch %s %s rank %d error_after_ms=%.0f code=%s: %s\n",
                  a.backend().c_str(), kind.c_str(), a.rank, ms, to_string(e.code()), what.c_str());
      require(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kRemoteError ||
                  e.code() == ErrorCode::kIoError,
              kind + ": a timeout, remote or I/O error");
      require(what.find(" on group '" + name + "'") != std::string::npos, "names the group");
      require(ms < a.timeout().count() + 2000.0, kind + ": within the timeout + 2 s");
    }
    // Nothing of the other rank's arrived in this rank's buffers.
    for (float x : f) require(x == static_cast<float>(a.rank + 1) || x == 3.0f, "no mixed data");
    destroy_collective_group(name);
    const std::string phase = "mismatch/" + std::to_string(k);
    store->set(phase + "/" + std::to_string(a.rank), "1");
    store->wait({phase + "/0", phase + "/1"});
  }
  // And the group works again.
  init_collective_group(2, a.rank, a.backend(), name, a.options());
  std::vector<int64_t> v(5, a.rank + 1);
  allreduce(v, name);
  require(v[4] == 3, "allreduce after the mismatches");
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// delay (world 2, timeout 1 s): rank 1 comes `delay` ms late to an allreduce, counted from
// rank 0's start (which rank 0 writes to the store: a sleep after each rank's own set-up once
// counted from whenever rank 1 got there). Under the timeout both get the right sum; over it
// rank 0 fails with kTimeout at the timeout and rank 1, late, fails too (never returns OK for an
// op rank 0 gave up on).
// ---------------------------------------------------------------------------------------------
void scenario_delay(const Args& a) {
  require(a.world == 2, "delay runs with 2 ranks");
  const long delay = a.num("delay", 300);
  const std::string name = a.name();
  auto store = open_store(a.store_url, milliseconds(30000));
  init_collective_group(2, a.rank, a.backend(), name, a.options());
  std::vector<float> v(1000, static_cast<float>(a.rank + 1));
  // CLOCK_MONOTONIC: one clock for both processes of this host.
  const auto since_boot_us = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  };
  const std::string started = name + "/rank0-started-us";
  if (a.rank == 1) {
    const auto rank0 =
        Clock::time_point(std::chrono::microseconds(std::stoll(store->get(started))));
    std::this_thread::sleep_until(rank0 + milliseconds(delay));
  }
  const auto start = Clock::now();
  if (a.rank == 0) store->set(started, std::to_string(since_boot_us(start)));
  const bool late = delay > a.timeout().count();
  try {
    allreduce(v, name);
    std::printf("FIGURE delay %s %ld ms rank %d: OK after %.0f ms\n", a.backend().c_str(), delay,
                a.rank, ms_since(start));
    require(!late, "an allreduce that its peer gave up on returned OK");
    for (float x : v) require(x == 3.0f, "allreduce sum");
  } catch (const Error& e) {
    const double ms = ms_since(start);
    std::printf("FIGURE delay %s %ld ms rank %d: %s after %.0f ms: %s\n", a.backend().c_str(),
                delay, a.rank, to_string(e.code()), ms, e.what());
    require(late, std::string("failed although the delay was under the timeout: ") + e.what());
    if (a.rank == 0) {
      require(e.code() == ErrorCode::kTimeout, "rank 0 times out");
      require(ms >= a.timeout().count() - 5 && ms < a.timeout().count() + 1000, "at the timeout");
    } else {
      require(e.code() == ErrorCode::kRemoteError || e.code() == ErrorCode::kAborted ||
                  e.code() == ErrorCode::kIoError,
              "rank 1 learns its peer gave up");
    }
    for (float x : v) require(x == static_cast<float>(a.rank + 1), "the buffer is untouched");
  }
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// late_reader (world 2, TUTTI_LINK_TIMEOUT_MS=link): rank 1 comes `delay` ms late to a 64 MiB
// allreduce, far past the link's bound and under the op's timeout. Rank 0's connection to it
// stands full (a zero window rank 1's kernel keeps answering probes for) the whole time: a late
// rank is not a cut link, and both get the right sum.
// ---------------------------------------------------------------------------------------------
void scenario_late_reader(const Args& a) {
  require(a.world == 2, "late_reader runs with 2 ranks");
  ::setenv("TUTTI_LINK_TIMEOUT_MS", std::to_string(a.num("link", 1000)).c_str(), 1);
  const long delay = a.num("delay", 3000);
  const std::string name = a.name();
  init_collective_group(2, a.rank, a.backend(), name, a.options());
  std::vector<float> v(16 << 20, static_cast<float>(a.rank + 1));
  if (a.rank == 1) std::this_thread::sleep_for(milliseconds(delay));
  const auto start = Clock::now();
  allreduce(v, name);
  std::printf("FIGURE late_reader %s rank %d: OK after %.0f ms (rank 1 %ld ms late)\n",
              a.backend().c_str(), a.rank, ms_since(start), delay);
  for (size_t i = 0; i < v.size(); i += 4099) require(v[i] == 3.0f, "allreduce sum");
  require(v.back() == 3.0f, "allreduce sum");
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// timeouts: an op timeout of 1 ms with the peer 50 ms late fails with kTimeout at once; a group
// and an op timeout of milliseconds::max() work (no overflow), and a peer's death under them is
// still found by the transport.
// ---------------------------------------------------------------------------------------------
void scenario_timeouts(const Args& a) {
  require(a.world == 2, "timeouts runs with 2 ranks");
  const std::string name = a.name();
  auto store = open_store(a.store_url, milliseconds(30000));
  GroupOptions o = a.options();
  o.timeout = milliseconds::max();
  init_collective_group(2, a.rank, a.backend(), name, o);
  auto g = get_group(name);
  std::vector<int32_t> v(100, a.rank + 1);
  AllreduceOptions forever;
  forever.timeout = milliseconds::max();
  g->allreduce(v, forever);
  require(v[0] == 3, "allreduce with a timeout of milliseconds::max()");
  std::fill(v.begin(), v.end(), a.rank + 1);
  g->allreduce(v);  // the group's timeout: milliseconds::max()
  require(v[0] == 3, "allreduce with a group timeout of milliseconds::max()");
  // 1 ms, the peer late: rank 1 calls only once rank 0's op has timed out (a store key, not a
  // sleep: a sleep's lateness is lost when rank 0 itself is held up as long on a busy machine).
  AllreduceOptions brief;
  brief.timeout = milliseconds(1);
  std::fill(v.begin(), v.end(), a.rank + 1);
  if (a.rank == 1) store->wait({"brief-timed-out/0"});
  const auto start = Clock::now();
  try {
    g->allreduce(v, brief);
    require(false, "a 1 ms allreduce with the peer late returned OK");
  } catch (const Error& e) {
    std::printf("FIGURE timeouts %s 1ms rank %d: %s after %.1f ms: %s\n", a.backend().c_str(),
                a.rank, to_string(e.code()), ms_since(start), e.what());
    if (a.rank == 0) require(e.code() == ErrorCode::kTimeout, "kTimeout");
    require(ms_since(start) < 1000, "promptly");
    if (a.rank == 0) store->set("brief-timed-out/0", "1");
  }
  destroy_collective_group(name);
  store->set("brief/" + std::to_string(a.rank), "1");
  store->wait({"brief/0", "brief/1"});
  // milliseconds::max() and a dead peer: rank 1 dies 100 ms into rank 0's allreduce.
  init_collective_group(2, a.rank, a.backend(), name, o);
  if (a.rank == 1) {
    std::this_thread::sleep_for(milliseconds(100));
    ::raise(SIGKILL);
  }
  const auto t0 = Clock::now();
  expect_error([&] { allreduce(v, name); }, {ErrorCode::kIoError, ErrorCode::kRemoteError},
               {"rank 1"});
  std::printf("FIGURE timeouts %s max+death rank 0: failed after %.0f ms (rank 1 died at ~100)\n",
              a.backend().c_str(), ms_since(t0));
  require(ms_since(t0) < 2000, "the death is found, not waited out");
  destroy_collective_group(name);
}

// ---------------------------------------------------------------------------------------------
// stale: one step of a job against a persistent store (file, Redis, a long-lived tutti-store)
// under one job id and group name: step=lonely (rank 0 alone: init times out), step=crash
// (rank 1 is SIGKILLed after init; rank 0's next op fails), step=normal (init and an allreduce
// must work whatever earlier steps left in the store).
// ---------------------------------------------------------------------------------------------
void scenario_stale(const Args& a) {
  const std::string name = a.name(), step = a.get("step", "normal");
  GroupOptions o = a.options();
  o.job_id = a.get("job");
  if (step == "lonely") {
    o.timeout = milliseconds(500);
    expect_error([&] { init_collective_group(a.world, a.rank, a.backend(), name, o); },
                 {ErrorCode::kTimeout}, {"init on group"});
    return;
  }
  const auto start = Clock::now();
  init_collective_group(a.world, a.rank, a.backend(), name, o);
  std::printf("FIGURE stale %s %s %s rank %d: init %.0f ms\n", a.backend().c_str(),
              a.get("store_kind").c_str(), step.c_str(), a.rank, ms_since(start));
  std::vector<int32_t> v(100, a.rank + 1);
  if (step == "crash") {
    if (a.rank == 1) ::raise(SIGKILL);
    std::this_thread::sleep_for(milliseconds(50));
    expect_error([&] { allreduce(v, name); }, {ErrorCode::kIoError, ErrorCode::kRemoteError},
                 {"rank 1"});
  } else {
    allreduce(v, name);
    require(v[0] == a.world * (a.world + 1) / 2, "allreduce");
  }
  destroy_collective_group(name);
}

// World 4: rank 2 is SIGKILLed in the middle of an allreduce loop (before its part of step
// `kill_at`, while the others are in it), and with second_kill_at, rank 3 later too; each time
// the survivors' op fails, they shrink, agree on the step to go on from, and finish the loop with
// the sums of those left. A bad exclude list is refused first, before any I/O. The survivors'
// last destroy is timed: the store's host (rank 0) exits after its own and must still serve them.
void scenario_shrink(const Args& a) {
  require(a.world == 4, "shrink runs with 4 ranks");
  // A "host" per rank: deaths are then seen through the store's closed connections only.
  // With ranks_per_host=N: ranks 0..N-1 on the first "host", and so on (hier's two levels).
  if (!a.get("host_id").empty()) {
    const int per_host = static_cast<int>(a.num("ranks_per_host", 1));
    ::setenv("TUTTI_HOST_ID", (a.get("host_id") + std::to_string(a.rank / per_host)).c_str(), 1);
  }
  const int steps = static_cast<int>(a.num("steps", 50));
  const int kill_at = static_cast<int>(a.num("kill_at", 20));
  const int second_kill_at = static_cast<int>(a.num("second_kill_at", -1));
  const double bound = static_cast<double>(a.num("bound", 2000));
  GroupOptions o = a.options();
  auto group = CollectiveGroup::create(4, a.rank, a.backend(), a.name(), o);
  std::vector<float> v(static_cast<size_t>(a.num("size", 4096)));
  int step = 0, shrinks = 0;
  while (step < steps) {
    if ((a.rank == 2 && step == kill_at) || (a.rank == 3 && step == second_kill_at)) {
      ::raise(SIGKILL);
    }
    std::fill(v.begin(), v.end(), static_cast<float>((group->global_rank() + 1) * (step + 1)));
    try {
      group->allreduce(v);
    } catch (const Error& e) {
      const auto failed_at = Clock::now();
      std::fprintf(stderr, "rank %d, step %d, world %d: %s\n", a.rank, step, group->world_size(),
                   e.what());
      require(shrinks < (second_kill_at >= 0 ? 2 : 1),
              "one failure per death: " + std::string(e.what()));
      expect_error(
          [&] { group->shrink(ShrinkOptions{{9}}); }, {ErrorCode::kInvalidArgument},
          {"shrink of", "excluded rank 9", "outside [0, " + std::to_string(group->world_size())});
      auto smaller = group->shrink();
      const double ms = ms_since(failed_at);
      group->destroy();
      const auto destroyed_ms = ms_since(failed_at) - ms;
      group = smaller;
      ++shrinks;
      std::vector<int64_t> resume{step};
      AllreduceOptions earliest;
      earliest.reduce_op = ReduceOp::kMin;
      group->allreduce(resume, earliest);
      std::printf(
          "FIGURE shrink %s rank %d -> %d of %d: shrink_ms=%.1f destroy_ms=%.1f, on from "
          "step %lld (failed in %d)\n",
          group->backend_name().c_str(), a.rank, group->rank(), group->world_size(), ms,
          destroyed_ms, static_cast<long long>(resume[0]), step);
      step = static_cast<int>(resume[0]);
      require(group->world_size() == 4 - shrinks, "one rank fewer after each shrink");
      require(group->global_rank() == a.rank, "keeps its rank in the job");
      require(ms < bound, "shrank within " + std::to_string(static_cast<int>(bound)) + " ms");
      continue;
    }
    // Global ranks + 1, times the step: 10 at world 4, 1 + 2 + 4 = 7 without rank 2, 3 without
    // ranks 2 and 3.
    float members = 0;
    for (int r : group->global_ranks()) members += static_cast<float>(r + 1);
    const float want = members * static_cast<float>(step + 1);
    for (float x : {v.front(), v.back()}) {
      require(x == want, "step " + std::to_string(step) + ": sum " + std::to_string(x) + ", want " +
                             std::to_string(want));
    }
    ++step;
  }
  const int left = second_kill_at >= 0 ? 2 : 3;
  require(group->world_size() == left, "the dead ranks are out");
  std::printf("shrink: rank %d finished %d steps at world %d\n", a.rank, steps,
              group->world_size());
  const auto start = Clock::now();
  group->destroy();
  const double ms = ms_since(start);
  std::printf("FIGURE shrink %s rank %d: last destroy_ms=%.1f\n", a.backend().c_str(), a.rank, ms);
  require(ms < 1000, "the last destroy is local and finds the store");
}

// World 1: a process with a flight-recorded group forks; the child makes a group of its own and
// asks for a dump (SIGUSR1): its own group's dump appears. Before, the child's handler wrote to
// the pipe it inherited, which its parent's thread read: the parent dumped its groups again, and
// the child's never appeared.
void scenario_flight_fork(const Args& a) {
  const std::string dir = a.get("dir");
  ::setenv("TUTTI_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  const std::string name = a.name();
  init_collective_group(1, 0, a.backend(), name + "-parent", a.options());
  std::vector<float> v(10, 1.0f);
  allreduce(v, name + "-parent");
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 3;
    try {
      init_collective_group(1, 0, a.backend(), name + "-child", a.options());
      allreduce(v, name + "-child");
      ::raise(SIGUSR1);
      const auto start = Clock::now();
      while (ms_since(start) < 5000 && files_in(dir, name + "-child").empty()) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      code = files_in(dir, name + "-child").empty() ? 4 : 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(code);
  }
  require(child > 0, "fork");
  int status = 0;
  require(::waitpid(child, &status, 0) == child, "waitpid");
  require(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child's SIGUSR1 dumped the child's group (exit " +
              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  require(files_in(dir, name + "-parent").empty(),
          "the parent dumped nothing: the child's signal was the child's");
  // The parent's own signal still dumps the parent's group.
  ::raise(SIGUSR1);
  const auto start = Clock::now();
  while (ms_since(start) < 5000 && files_in(dir, name + "-parent").empty()) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  require(!files_in(dir, name + "-parent").empty(), "the parent's SIGUSR1 dumped its group");
  destroy_collective_group(name + "-parent");
}

// World 3: a rank dies while the group's backend is being made, after the rendezvous, and the
// others fail their init within `bound` ms (the group's timeout is 20 s), naming it. The
// backend is `backend` made through a wrapper ("dying-<backend>") that kills the rank:
//   who=peer: rank 1 exits as its backend is about to be made; ranks 0 and 2 wait for it there.
//   who=creator (shm): rank 0 makes the segment and exits once its name is in the store; rank 1
//     maps it, rank 2 never does (it waits in the store). The test then finds no segment of the
//     group in /dev/shm.
//   who=all (shm): rank 0 makes the segment, and once its name is in the store writes its pid to
//     the file `pidfile` and stops itself (SIGSTOP: alive, so no sweep takes the segment while the
//     test looks; the test then SIGKILLs it); ranks 1 and 2 exit once the file is there. Nobody
//     is left to take the name away: the next group's sweep must.
void scenario_setup_death(const Args& a) {
  require(a.world == 3, "setup_death runs with 3 ranks");
  const std::string inner = a.backend(), who = a.get("who", "peer"), name = a.name();
  require(who == "peer" || ((who == "creator" || who == "all") && inner == "shm"), "who=" + who);
  const int dying = who == "creator" ? 0 : 1;
  const double bound = static_cast<double>(a.num("bound", 2000));
  register_collective_backend(
      "dying-" + inner, [inner, who, a](const BackendContext& ctx) -> std::unique_ptr<Backend> {
        if (who == "peer" && ctx.rank == 1) ::_exit(7);
        if (who == "all" && ctx.rank != 0) {
          const std::string pidfile = a.get("pidfile", "");
          const auto start = Clock::now();
          while (::access(pidfile.c_str(), F_OK) != 0 && ms_since(start) < 20000) {
            std::this_thread::sleep_for(milliseconds(2));
          }
          ::_exit(7);
        }
        if ((who == "creator" || who == "all") && ctx.rank == 0) {
          std::thread([store = ctx.store, pidfile = who == "all" ? a.get("pidfile", "") : ""] {
            try {
              store->wait({"shm/segment"}, milliseconds(20000));
            } catch (...) {
            }
            if (!pidfile.empty()) {
              const std::string tmp = pidfile + ".tmp";
              std::FILE* f = std::fopen(tmp.c_str(), "w");
              if (f != nullptr) {
                std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
                std::fclose(f);
                std::rename(tmp.c_str(), pidfile.c_str());
              }
              ::raise(SIGSTOP);  // the whole process, before it can see its peers exit
            }
            ::_exit(7);
          }).detach();
        }
        if (who == "creator" && ctx.rank == 2) {
          ctx.store->wait({"never"});
          throw std::runtime_error("the wait for a key nobody writes returned");
        }
        return create_collective_backend(inner, ctx);
      });
  GroupOptions o = a.options();
  o.timeout = milliseconds(20000);
  const auto start = Clock::now();
  expect_error([&] { init_collective_group(3, a.rank, "dying-" + inner, name, o); },
               {ErrorCode::kIoError, ErrorCode::kRemoteError},
               {"rank " + std::to_string(dying), "exited"});
  const double ms = ms_since(start);
  std::printf("FIGURE setup_death %s %s rank %d: init failed in %.0f ms\n", inner.c_str(),
              who.c_str(), a.rank, ms);
  require(ms < bound, "the init fails within " + std::to_string(bound) + " ms, not at the timeout");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, void (*)(const Args&)> scenarios = {
      {"fork", scenario_fork},
      {"threads", scenario_threads},
      {"flight", scenario_flight},
      {"crash", scenario_crash},
      {"rejoin", scenario_rejoin},
      {"cycles", scenario_cycles},
      {"mismatch", scenario_mismatch},
      {"delay", scenario_delay},
      {"late_reader", scenario_late_reader},
      {"timeouts", scenario_timeouts},
      {"stale", scenario_stale},
      {"shrink", scenario_shrink},
      {"setup_death", scenario_setup_death},
      {"flight_fork", scenario_flight_fork},
  };
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s <scenario> <rank> <world_size> <store_url> [key=value...]\n",
                 argv[0]);
    return 2;
  }
  Args a;
  a.scenario = argv[1];
  a.rank = std::atoi(argv[2]);
  a.world = std::atoi(argv[3]);
  a.store_url = argv[4];
  for (int i = 5; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) {
      std::fprintf(stderr, "argument '%s' is not key=value\n", argv[i]);
      return 2;
    }
    a.kv[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
  }
  auto it = scenarios.find(a.scenario);
  if (it == scenarios.end()) {
    std::fprintf(stderr, "unknown scenario '%s'\n", a.scenario.c_str());
    return 2;
  }
  try {
    it->second(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d FAILED: %s\n", a.rank, e.what());
    return 1;
  }
  std::fprintf(stderr, "rank %d OK\n", a.rank);
  return 0;
}
