// tutti-fault-bench: the reliability promises, measured. Each fault is made REPS times and the
// time from the fault to what it must cause is printed as p50 and p99 against its bound:
//
//   abort        abort() of a group whose op waits for a peer that never comes -> the op ends
//   split-abort  abort() of the parent while a split waits for a member -> the split ends
//   kill         SIGKILL of the peer process in the middle of an allreduce loop -> this rank's
//                op fails naming it (the transport's detection time)
//   stop         SIGSTOP of the peer -> the op fails at its timeout, not later
//   shrink       SIGKILL of one rank of three in an allreduce loop -> the two survivors'
//                shrink() has returned a working group of two
//   cancel       Fetch::cancel() of a 1 GiB get in the middle of its copy -> the get ends
//   consumer     SIGKILL of a consumer process holding a borrow -> the owner's
//                wait_tensor_freed returns
//   cut          (root, gloo) the link to the peer's "host" cut (a network namespace behind a
//                veth pair, taken down: no reset comes) in the middle of an allreduce loop whose
//                op timeout is a minute -> this rank's op fails, within TUTTI_LINK_TIMEOUT_MS
//                (--link-ms, default 2000 here) and a poll's quarter of it; --cut-reps of them
//
//   tutti-fault-bench [--reps N] [--backend gloo|shm|all] [--only NAME[,NAME...]]
//                     [--cancel-bytes BYTES] [--link-ms MS] [--cut-reps N]
//
// The exit status is 1 when any p99 misses its bound. A peer is this program again
// (--child ...), started with posix_spawn; every wait in it is bounded.
#include <signal.h>
#include <spawn.h>
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
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tutti/tutti.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace tutti;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string unique(const std::string& what) {
  static std::atomic<int> n{0};
  return "faultbench-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

uint16_t free_port() {
  TCPStoreServer probe("127.0.0.1", 0);
  return probe.port();
}

// This program's path (a command run under another, which /proc/self/exe would name there).
std::string self_path() {
  char path[4096] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

// A shell command's exit status (its output to /dev/null).
int sh(const std::string& command) {
  const int status = std::system((command + " > /dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A child process running this program with `args`; killed (and reaped) when it goes.
class Child {
 public:
  // `prefix`: a command this program runs under (`ip netns exec NS env ...`), which execs it.
  explicit Child(const std::vector<std::string>& args,
                 const std::vector<std::string>& prefix = {}) {
    std::vector<std::string> all = prefix;
    all.push_back(prefix.empty() ? std::string("/proc/self/exe") : self_path());
    all.push_back("--child");
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::pipe(out_) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_[1], 1);
    posix_spawn_file_actions_addclose(&actions, out_[0]);
    const int rc = ::posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out_[1]);
    if (rc != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
  }
  ~Child() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(out_[0]);
  }
  pid_t pid() const { return pid_; }
  // The child's next line on stdout (it says when it is ready).
  std::string line() {
    std::string s;
    char c;
    while (::read(out_[0], &c, 1) == 1 && c != '\n') s += c;
    return s;
  }

 private:
  pid_t pid_ = -1;
  int out_[2] = {-1, -1};
};

struct Figure {
  std::string name, backend, what;
  double bound_ms;
  std::vector<double> ms;
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[at];
}

// ---- children ----

// An allreduce loop at rank `rank` of `world` through `url` until it fails or the parent kills
// it; says "ready" once the group is made.
int child_loop(const std::string& backend, const std::string& url, int rank, int world,
               const std::string& name) {
  GroupOptions o;
  o.store_url = url;
  o.timeout = milliseconds(10000);
  auto g = CollectiveGroup::create(world, rank, backend, name, o);
  std::printf("ready\n");
  std::fflush(stdout);
  std::vector<float> v(16384, 1.0f);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  try {
    while (Clock::now() < deadline) g->allreduce(v);
  } catch (const Error&) {
    // a peer died: shrink with the others (the shrink measurement's third rank)
    auto small = g->shrink();
    g->destroy();
    std::vector<float> w(4, 1.0f);
    small->allreduce(w);
    small->destroy();
  }
  return 0;
}

// Borrows the object of `ref_text` and holds it until killed.
int child_borrow(const std::string& ref_text) {
  auto agent = TransferAgent::create({"consumer"});
  Borrowed b = agent->borrow(TensorRef::from_text(ref_text));
  std::printf("borrowed\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// ---- measurements ----

// Two ranks as threads; rank 1 never joins the op; abort() from a third thread.
double measure_abort(const std::string& backend, bool split) {
  auto store = std::make_shared<HashStore>();
  const std::string name = unique(split ? "split-abort" : "abort");
  std::shared_ptr<CollectiveGroup> groups[2];
  std::thread t1([&] {
    GroupOptions o;
    o.store = store;
    o.timeout = milliseconds(10000);
    groups[1] = CollectiveGroup::create(2, 1, backend, name, o);
  });
  GroupOptions o;
  o.store = store;
  o.timeout = milliseconds(10000);
  std::atomic<bool> waiting{false};
  Clock::time_point asked, ended;
  std::thread t0([&] {
    groups[0] = CollectiveGroup::create(2, 0, backend, name, o);
    t1.join();
    waiting = true;
    try {
      if (split) {
        groups[0]->split({0, 1});
      } else {
        std::vector<float> v(1024, 1.0f);
        groups[0]->allreduce(v);
      }
    } catch (const Error&) {
    }
    ended = Clock::now();
  });
  while (!waiting) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(30));  // well inside the op or the split's meeting
  asked = Clock::now();
  groups[0]->abort("the fault bench aborts it");
  t0.join();
  groups[0]->destroy();
  groups[1]->destroy();
  return ms_between(asked, ended);
}

// This process is rank 0 of 2 (or of 3 for shrink) through a TCP store it hosts; the peers are
// children. kill: SIGKILL a peer mid-loop, time to this rank's error. stop: SIGSTOP it, the
// op's timeout, and the time past it. shrink: SIGKILL rank 2, time until shrink() returned.
double measure_peer(const std::string& backend, const std::string& how) {
  const int world = how == "shrink" ? 3 : 2;
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  const std::string name = unique(how);
  GroupOptions o;
  o.store_url = url;
  o.timeout = milliseconds(how == "stop" ? 500 : 10000);
  std::vector<std::unique_ptr<Child>> peers;
  std::shared_ptr<CollectiveGroup> g;
  std::thread maker([&] { g = CollectiveGroup::create(world, 0, backend, name, o); });
  for (int r = 1; r < world; ++r) {
    peers.push_back(std::make_unique<Child>(std::vector<std::string>{
        "loop", backend, url, std::to_string(r), std::to_string(world), name}));
  }
  maker.join();
  for (auto& p : peers) p->line();  // "ready"
  Child& victim = *peers.back();
  std::atomic<bool> faulted{false};
  Clock::time_point fault_at;
  std::thread faulter([&] {
    std::this_thread::sleep_for(milliseconds(40));
    fault_at = Clock::now();
    faulted = true;
    ::kill(victim.pid(), how == "stop" ? SIGSTOP : SIGKILL);
  });
  std::vector<float> v(16384, 1.0f);
  Clock::time_point failed_at;
  Clock::time_point op_start;
  double result = -1;
  std::string why;
  try {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      op_start = Clock::now();
      g->allreduce(v);
    }
  } catch (const Error& e) {
    failed_at = Clock::now();
    why = e.what();
  }
  faulter.join();
  if (how == "kill") {
    result = ms_between(fault_at, failed_at);
    if (result > 100)
      std::fprintf(stderr, "fault-bench: kill seen after %.1f ms: %s\n", result, why.c_str());
  } else if (how == "stop") {
    // The op that failed began before the stop or after it; either way it may run its whole
    // timeout: the figure is how far past that timeout it ended.
    const auto began = std::max(op_start, fault_at);
    result = ms_between(began + o.timeout, failed_at);
    if (result < 0) result = 0;
    ::kill(victim.pid(), SIGKILL);
  } else {
    auto small = g->shrink();
    std::vector<float> w(4, 1.0f);
    small->allreduce(w);
    result = ms_between(fault_at, Clock::now());
    if (w[0] != 2.0f) throw std::runtime_error("the shrunk group's sum is wrong");
    small->destroy();
  }
  g->destroy();
  peers.clear();
  return result;
}

// An agent's 1 GiB get cancelled in the middle of its copy (shm: 256 MiB slices).
double measure_cancel(size_t bytes) {
  static std::shared_ptr<TransferAgent> owner = TransferAgent::create({"owner"});
  static std::shared_ptr<TransferAgent> consumer = TransferAgent::create({"consumer"});
  static TensorView source = [&] {
    TensorView s = owner->allocate(bytes);
    std::memset(s.data(), 7, bytes);
    return s;
  }();
  static std::vector<uint8_t> target(bytes);
  ObjectHandle obj = owner->put({source});
  std::fill(target.begin(), target.end(), 0);
  GetOptions go;
  go.targets = {TensorView(target)};
  go.timeout = std::chrono::seconds(60);
  Fetch f = consumer->get_async(obj.ref(), go);
  const auto begun = Clock::now();
  volatile uint8_t* first = target.data();
  while (*first == 0 && !f.done() && Clock::now() - begun < std::chrono::seconds(30)) {
    std::this_thread::yield();
  }
  const auto asked = Clock::now();
  f.cancel();
  try {
    f.wait();
  } catch (const Error&) {
  }
  const double ms = ms_between(asked, Clock::now());
  obj.release();
  owner->wait_tensor_freed(source, std::chrono::seconds(30));
  return ms;
}

// A consumer process borrows; the owner waits for the object to be freed; the consumer is
// SIGKILLed: time until the owner's wait returns. The tensor is in the agent's shareable memory
// (allocate()): the borrow maps it, and so holds the object (a borrow of other memory is a copy,
// which holds nothing: the owner's wait would return at once and measure nothing).
double measure_consumer() {
  static std::shared_ptr<TransferAgent> owner = TransferAgent::create({"owner"});
  TensorView view = owner->allocate(size_t{1} << 18, DType::kFloat32);
  struct Give {
    TransferAgent& agent;
    TensorView view;
    ~Give() {
      try {
        agent.deallocate(view);
      } catch (const Error&) {
        // Still held (a failed measurement): the agent keeps it until it goes.
      }
    }
  } give{*owner, view};
  std::fill_n(static_cast<float*>(view.data()), view.numel(), 1.0f);
  ObjectHandle obj = owner->put({view});
  Child consumer({"borrow", obj.ref().to_text()});
  if (consumer.line() != "borrowed") throw std::runtime_error("the consumer did not borrow");
  obj.release();
  Clock::time_point killed, freed;
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    owner->wait_tensor_freed(view, std::chrono::seconds(30));
    freed = Clock::now();
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(20));
  const bool early = returned.load();
  killed = Clock::now();
  ::kill(consumer.pid(), SIGKILL);
  waiter.join();
  if (early || freed < killed) {
    throw std::runtime_error(
        "the owner's wait_tensor_freed returned while the consumer still "
        "held its borrow");
  }
  return ms_between(killed, freed);
}

// A second "host": network namespace `ns` behind a veth pair, this side 10.231.9.1 (in this
// process's namespace), the other 10.231.9.2. Made once, removed when it goes.
class OtherHost {
 public:
  OtherHost() {
    const std::string id = std::to_string(::getpid() % 100000);
    ns_ = "tutti-fb-" + id;
    here_ = "tfb" + id + "a";
    const std::string there = "tfb" + id + "b";
    ok_ = sh("ip netns add " + ns_) == 0 &&
          sh("ip link add " + here_ + " type veth peer name " + there) == 0 &&
          sh("ip link set " + there + " netns " + ns_) == 0 &&
          sh("ip addr add 10.231.9.1/24 dev " + here_) == 0 &&
          sh("ip link set " + here_ + " up") == 0 &&
          sh("ip -n " + ns_ + " addr add 10.231.9.2/24 dev " + there) == 0 &&
          sh("ip -n " + ns_ + " link set " + there + " up") == 0 &&
          sh("ip -n " + ns_ + " link set lo up") == 0;
  }
  ~OtherHost() {
    sh("ip link del " + here_);  // both ends
    sh("ip netns del " + ns_);
  }
  bool ok() const { return ok_; }
  const std::string& ns() const { return ns_; }
  bool link(bool up) { return sh("ip link set " + here_ + (up ? " up" : " down")) == 0; }

 private:
  std::string ns_, here_;
  bool ok_ = false;
};

// This process is rank 0 (Gloo, a TCP store it hosts on 10.231.9.1, op timeout a minute); rank 1
// runs in the other host's namespace. Once both loop, the link goes down: the time from then to
// this rank's error, which must name the cut.
double measure_cut(OtherHost& host) {
  if (!host.link(true)) throw std::runtime_error("cut: cannot bring the link up");
  const std::string url = "tcp://10.231.9.1:" + std::to_string(20000 + ::getpid() % 20000);
  const std::string name = unique("cut");
  ::setenv("TUTTI_GLOO_HOSTNAME", "10.231.9.1", 1);
  GroupOptions o;
  o.store_url = url;
  o.timeout = milliseconds(60000);
  std::shared_ptr<CollectiveGroup> g;
  std::thread maker([&] { g = CollectiveGroup::create(2, 0, "gloo", name, o); });
  auto peer =
      std::make_unique<Child>(std::vector<std::string>{"loop", "gloo", url, "1", "2", name},
                              std::vector<std::string>{"ip", "netns", "exec", host.ns(), "env",
                                                       "TUTTI_GLOO_HOSTNAME=10.231.9.2",
                                                       "TUTTI_HOST_ID=fault-bench-other"});
  maker.join();
  ::unsetenv("TUTTI_GLOO_HOSTNAME");
  peer->line();  // "ready"
  Clock::time_point cut_at;
  std::thread cutter([&] {
    std::this_thread::sleep_for(milliseconds(40));
    cut_at = Clock::now();
    host.link(false);
  });
  std::vector<float> v(16384, 1.0f);
  Clock::time_point failed_at;
  std::string why;
  try {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline) g->allreduce(v);
  } catch (const Error& e) {
    failed_at = Clock::now();
    why = e.what();
  }
  cutter.join();
  peer.reset();
  g->destroy();
  if (why.find("the link or the host is gone") == std::string::npos) {
    throw std::runtime_error("cut: the op did not fail naming the cut: " + why);
  }
  return ms_between(cut_at, failed_at);
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  // Every fault aborts groups, whose flight recorders then log their last ops: not what is
  // measured here (TUTTI_LOG_LEVEL set by the caller is kept). The children inherit it.
  ::setenv("TUTTI_LOG_LEVEL", "error", 0);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "--child") {
      if (args.size() == 7 && args[1] == "loop") {
        return child_loop(args[2], args[3], std::stoi(args[4]), std::stoi(args[5]), args[6]);
      }
      if (args.size() == 3 && args[1] == "borrow") return child_borrow(args[2]);
      std::fprintf(stderr, "tutti-fault-bench: bad child arguments\n");
      return 2;
    }
    int reps = 20;
    std::vector<std::string> backends = {"gloo", "shm"};
    std::set<std::string> only;
    size_t cancel_bytes = size_t{1} << 30;
    long link_ms = 2000;
    int cut_reps = 5;
    for (size_t i = 0; i < args.size(); ++i) {
      auto value = [&]() -> std::string {
        if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
        return args[++i];
      };
      if (args[i] == "--reps") {
        reps = std::stoi(value());
      } else if (args[i] == "--backend") {
        const std::string b = value();
        backends =
            b == "all" ? std::vector<std::string>{"gloo", "shm"} : std::vector<std::string>{b};
      } else if (args[i] == "--only") {
        std::stringstream list(value());
        for (std::string item; std::getline(list, item, ',');) only.insert(item);
      } else if (args[i] == "--cancel-bytes") {
        cancel_bytes = std::stoull(value());
      } else if (args[i] == "--link-ms") {
        link_ms = std::stol(value());
      } else if (args[i] == "--cut-reps") {
        cut_reps = std::stoi(value());
      } else if (args[i] == "-h" || args[i] == "--help") {
        std::printf(
            "usage: tutti-fault-bench [--reps N] [--backend gloo|shm|all] "
            "[--only abort,split-abort,kill,stop,shrink,cancel,consumer,cut] "
            "[--cancel-bytes BYTES] [--link-ms MS] [--cut-reps N]\n");
        return 0;
      } else {
        throw std::invalid_argument("unknown option '" + args[i] + "'");
      }
    }
    if (reps < 1 || cut_reps < 1) throw std::invalid_argument("--reps must be at least 1");
    if (link_ms < 1000) throw std::invalid_argument("--link-ms must be at least 1000");
    // Read once per process by the library: set before any group. Every case runs under it
    // (none of the others cuts a link; a SIGSTOPped peer's kernel still answers for it).
    ::setenv("TUTTI_LINK_TIMEOUT_MS", std::to_string(link_ms).c_str(), 1);
    auto wanted = [&](const std::string& n) { return only.empty() || only.count(n) != 0; };
    std::vector<Figure> figures;
    auto run = [&](const std::string& n, const std::string& backend, const std::string& what,
                   double bound, const std::function<double()>& once) {
      if (!wanted(n)) return;
      Figure f{n, backend, what, bound, {}};
      const int times = n == "cut" ? cut_reps : reps;
      for (int r = 0; r < times; ++r) f.ms.push_back(once());
      std::fprintf(stderr, "fault-bench: %s %s done\n", n.c_str(), backend.c_str());
      figures.push_back(std::move(f));
    };
    for (const auto& b : backends) {
      run("abort", b, "abort() -> the waiting op ends", 100,
          [&] { return measure_abort(b, false); });
      run("split-abort", b, "abort() of the parent -> the waiting split ends", 50,
          [&] { return measure_abort(b, true); });
      run("kill", b, "peer SIGKILLed mid-allreduce -> this rank's op fails", 100,
          [&] { return measure_peer(b, "kill"); });
      run("stop", b, "peer SIGSTOPped -> the op fails at its 500 ms timeout (ms past it)", 100,
          [&] { return measure_peer(b, "stop"); });
      run("shrink", b, "1 of 3 SIGKILLed -> the survivors' shrink() returned, one op done", 1000,
          [&] { return measure_peer(b, "shrink"); });
    }
    const std::string gib = std::to_string(cancel_bytes >> 20) + " MiB";
    run("cancel", "shm", "Fetch::cancel() mid-copy of a " + gib + " get -> the get ends", 100,
        [&] { return measure_cancel(cancel_bytes); });
    run("consumer", "shm", "borrowing consumer SIGKILLed -> owner's wait_tensor_freed returns", 100,
        measure_consumer);
    if (wanted("cut") && std::find(backends.begin(), backends.end(), "gloo") != backends.end()) {
      std::unique_ptr<OtherHost> host;
      if (::geteuid() == 0) host = std::make_unique<OtherHost>();
      if (host && host->ok()) {
        const std::string ms = std::to_string(link_ms);
        // The bound's own quarter is a poll's slice, 200 ms the second look, 300 ms the rest.
        run("cut", "gloo",
            "link to the peer's host cut, op timeout 60 s -> this rank's op fails "
            "(TUTTI_LINK_TIMEOUT_MS=" +
                ms + ")",
            static_cast<double>(link_ms + link_ms / 4 + 500), [&] { return measure_cut(*host); });
      } else {
        std::fprintf(stderr,
                     "fault-bench: cut not measured: a second host needs root and `ip` (network "
                     "namespaces)\n");
      }
    }
    bool all_met = true;
    std::printf("| fault | backend | p50 ms | p99 ms | max ms | bound ms | reps | |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (const auto& f : figures) {
      const double p50 = percentile(f.ms, 0.5), p99 = percentile(f.ms, 0.99);
      const double max = *std::max_element(f.ms.begin(), f.ms.end());
      const bool met = p99 <= f.bound_ms;
      all_met = all_met && met;
      std::printf("| %s: %s | %s | %.1f | %.1f | %.1f | %.0f | %zu | %s |\n", f.name.c_str(),
                  f.what.c_str(), f.backend.c_str(), p50, p99, max, f.bound_ms, f.ms.size(),
                  met ? "met" : "MISSED");
    }
    return all_met ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tutti-fault-bench: %s\n", e.what());
    return 2;
  }
}
