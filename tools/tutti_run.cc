// tutti-run: starts the local ranks of a job, torchrun-style.
//
//   tutti-run -n 4 ./train args...
//
// Hosts the job's TCP store (node 0), starts each rank with TUTTI_RANK, TUTTI_WORLD_SIZE,
// TUTTI_LOCAL_RANK, TUTTI_LOCAL_WORLD_SIZE, TUTTI_JOB_ID, TUTTI_STORE (and TUTTI_BACKEND with
// --backend), prefixes each output line with its rank, and ends the job at the first rank that
// fails, exiting with that rank's status.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/tcp_store.h"
#include "tutti/version.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: tutti-run [options] [--] PROGRAM [ARGS...]

Starts the local ranks of a tutti job and the job's TCP store.

options:
  -n, --nproc-per-node N  ranks to start on this node (default 1)
  --nnodes N              nodes in the job (default 1)
  --node-rank K           this node's index, 0..N-1 (default 0)
  --master-addr HOST      where node 0 serves the store (default 127.0.0.1)
  --master-port PORT      the store's port (default: a free port with one node, 29500 with more)
  --backend NAME          the backend, passed on as TUTTI_BACKEND
  --job-id ID             passed on as TUTTI_JOB_ID (default: random with one node; with more,
                          the store's own id)
  --timeout SECONDS       end the job (exit 124) when it runs longer
  --no-prefix             do not prefix output lines with "[rank]: "
  --max-failures N        up to N ranks may fail without ending the job (for programs whose
                          survivors go on: CollectiveGroup::shrink); the job then succeeds when
                          every other rank exits 0 (default 0: the first failure ends it)
  --bind-to core|none     core: the CPUs this launcher may use are split between the local
                          ranks, each rank on its own share (the default with several ranks
                          that fit, one CPU or more each); none: the scheduler places them
  -h, --help              this text
  --version               tutti's version

Each rank gets TUTTI_RANK, TUTTI_WORLD_SIZE, TUTTI_LOCAL_RANK, TUTTI_LOCAL_WORLD_SIZE,
TUTTI_STORE, TUTTI_STORE_SECRET and TUTTI_JOB_ID; tutti::init_collective_group_from_env()
reads them. The store refuses clients that do not prove TUTTI_STORE_SECRET: with one node,
tutti-run makes a random one for the job unless the environment sets one; with several, set
the same TUTTI_STORE_SECRET on every node (without it the store is open to anyone who can
reach its port, and tutti-run says so).
The first rank to fail ends the others; tutti-run exits with its status (128+N for signal N).
A job whose every rank on this node failed (within --max-failures) exits with the last one's
status.
SIGINT, SIGTERM, SIGHUP and SIGQUIT end the ranks (SIGTERM to each rank's process group, SIGKILL
5 s later, or at once on a second signal). Ranks read stdin as /dev/null. Once every rank has
ended, what they started and left holding their output gets 2 s, then SIGTERM, then SIGKILL.
)";

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signals = 0;  // how many came: a second one kills at once
void on_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "tutti-run: %s\n(see tutti-run --help)\n", message.c_str());
  std::exit(2);
}

long parse_number(const std::string& option, const char* text, long min_value, long max_value) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < min_value || v > max_value) {
    usage_error(option + " needs an integer in [" + std::to_string(min_value) + ", " +
                std::to_string(max_value) + "], got '" + text + "'");
  }
  return v;
}

struct Options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  long master_port = -1;
  std::string backend;
  std::string job_id;
  long timeout_s = 0;
  bool prefix = true;
  long max_failures = 0;
  std::string bind_to;  // "core", "none", or "" (core when the ranks fit)
  std::vector<std::string> command;
};

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const std::string& option) -> const char* {
    if (i + 1 >= argc) usage_error(option + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-') break;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--version") {
      std::printf("tutti-run %s\n", tutti::version());
      std::exit(0);
    } else if (a == "-n" || a == "--nproc-per-node" || a == "--nproc_per_node") {
      o.nproc = static_cast<int>(parse_number(a, value(a), 1, 4096));
    } else if (a == "--nnodes") {
      o.nnodes = static_cast<int>(parse_number(a, value(a), 1, 100000));
    } else if (a == "--node-rank" || a == "--node_rank") {
      o.node_rank = static_cast<int>(parse_number(a, value(a), 0, 100000));
    } else if (a == "--master-addr" || a == "--master_addr") {
      o.master_addr = value(a);
    } else if (a == "--master-port" || a == "--master_port") {
      o.master_port = parse_number(a, value(a), 0, 65535);
    } else if (a == "--backend") {
      o.backend = value(a);
    } else if (a == "--job-id") {
      o.job_id = value(a);
    } else if (a == "--timeout") {
      o.timeout_s = parse_number(a, value(a), 1, 100L * 24 * 3600);
    } else if (a == "--max-failures" || a == "--max_failures") {
      o.max_failures = parse_number(a, value(a), 0, 100000);
    } else if (a == "--no-prefix") {
      o.prefix = false;
    } else if (a == "--bind-to" || a == "--bind_to") {
      o.bind_to = value(a);
      if (o.bind_to != "core" && o.bind_to != "none") {
        usage_error("--bind-to takes core or none, got '" + o.bind_to + "'");
      }
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  if (o.command.empty()) usage_error("no program to run");
  if (o.node_rank >= o.nnodes) {
    usage_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                std::to_string(o.nnodes));
  }
  return o;
}

// n random bytes from the kernel (getrandom), in hex.
std::string random_hex(size_t n) {
  std::string bytes(n, '\0');
  size_t have = 0;
  while (have < n) {
    const ssize_t got = ::getrandom(&bytes[have], n - have, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      std::fprintf(stderr, "tutti-run: getrandom failed: %s\n", std::strerror(errno));
      std::exit(1);
    }
    have += static_cast<size_t>(got);
  }
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string random_id() {
  return random_hex(8);
}

// Forwards a child's output line by line, each prefixed with its rank.
struct Stream {
  int fd = -1;
  FILE* out = nullptr;
  std::string prefix;
  std::string pending;

  void forward(const char* data, size_t n) {
    pending.append(data, n);
    size_t start = 0;
    while (true) {
      const auto nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      std::fwrite(prefix.data(), 1, prefix.size(), out);
      std::fwrite(pending.data() + start, 1, nl + 1 - start, out);
      start = nl + 1;
    }
    pending.erase(0, start);
    std::fflush(out);
  }
  void flush_rest() {
    if (pending.empty()) return;
    pending.push_back('\n');
    forward("", 0);
  }
  // The end of the output: what is pending goes, the pipe closes.
  void finish() {
    flush_rest();
    close(fd);
    fd = -1;
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  bool group_gone = false;  // reaped, and its process group found empty: never signalled again

  // For a reaped rank: whether its process group is empty now (then marked gone for good).
  bool group_emptied() {
    if (!group_gone && !running && pid > 0 && kill(-pid, 0) != 0 && errno == ESRCH) {
      group_gone = true;
    }
    return group_gone;
  }
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int world = o.nproc * o.nnodes;

  // Node 0 serves the store; the port it bound is what every rank is told.
  std::unique_ptr<tutti::TCPStoreServer> server;
  long port = o.master_port;
  if (port < 0) port = o.nnodes == 1 ? 0 : 29500;
  // The job's store secret: the environment's, else (one node) a random one, so that no other
  // user's process on this host can read or write the job's keys (or join its groups).
  std::string secret;
  if (const char* s = std::getenv("TUTTI_STORE_SECRET")) secret = s;
  if (secret.empty() && o.nnodes == 1) secret = random_hex(32);
  if (secret.empty() && o.node_rank == 0) {
    std::fprintf(stderr,
                 "tutti-run: the store has no secret (set the same TUTTI_STORE_SECRET on every "
                 "node to keep other users' processes out)\n");
  }
  if (o.node_rank == 0) {
    try {
      server = std::make_unique<tutti::TCPStoreServer>(o.master_addr, static_cast<uint16_t>(port),
                                                       secret);
      port = server->port();
    } catch (const tutti::Error& e) {
      std::fprintf(stderr, "tutti-run: cannot serve the store: %s\n", e.what());
      return 1;
    }
  } else if (port == 0) {
    usage_error("--master-port is needed on nodes other than node 0");
  }
  std::string host = o.master_addr;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const std::string store_url = "tcp://" + host + ":" + std::to_string(port);
  std::string job_id = o.job_id;
  if (job_id.empty() && std::getenv("TUTTI_JOB_ID")) job_id = std::getenv("TUTTI_JOB_ID");
  if (job_id.empty() && o.nnodes == 1) job_id = random_id();

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  // SIGHUP too (the terminal or the ssh session went): the ranks lead process groups of their
  // own, so a hangup reaches them only through this launcher.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Two pipes per rank: many ranks need more descriptors than the usual soft limit of 1024.
  // Raised only as far as needed (the ranks inherit it; select() breaks past 1024).
  rlimit files{};
  const rlim_t needed = static_cast<rlim_t>(2 * o.nproc + 64);
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < needed) {
    files.rlim_cur = std::min(files.rlim_max, needed);
    setrlimit(RLIMIT_NOFILE, &files);
  }

  // Binding: the CPUs this launcher may use, split between the ranks, each on its own share.
  // Left to the scheduler, two ranks can end up on one core (a futex wake pulls the woken task
  // towards the waker's core), and then every step waits for the other's turn on it: shm's
  // 8-byte allreduce at 2 ranks on 2 cores took ~6-10 us per call in 3 of 18 runs, against
  // 0.6-0.8 us; bound, 18 of 18 took 0.6-0.8 us. A share of several CPUs leaves a rank's own
  // threads room.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
  }
  const bool fits = !cpus.empty() && static_cast<size_t>(o.nproc) <= cpus.size();
  if (o.bind_to == "core" && !fits) {
    usage_error("--bind-to core: " + std::to_string(o.nproc) +
                " ranks, and this launcher may use " + std::to_string(cpus.size()) + " CPU(s)");
  }
  const bool bind = fits && (o.bind_to == "core" || (o.bind_to.empty() && o.nproc > 1));
  auto share_of = [&](int local) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const size_t n = cpus.size(), k = static_cast<size_t>(o.nproc);
    const size_t first = n * static_cast<size_t>(local) / k;
    const size_t last = n * static_cast<size_t>(local + 1) / k;
    for (size_t c = first; c < last; ++c) CPU_SET(cpus[c], &set);
    return set;
  };

  std::vector<Rank> ranks(o.nproc);
  // A start that fails part-way ends the ranks already started.
  const auto kill_started = [&] {
    for (auto& other : ranks) {
      if (other.running) kill(-other.pid, SIGKILL);
    }
  };
  std::vector<Stream> streams;
  for (int local = 0; local < o.nproc; ++local) {
    Rank& r = ranks[local];
    r.rank = o.node_rank * o.nproc + local;
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (eq) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
    }
    env["TUTTI_RANK"] = std::to_string(r.rank);
    env["TUTTI_WORLD_SIZE"] = std::to_string(world);
    env["TUTTI_LOCAL_RANK"] = std::to_string(local);
    env["TUTTI_LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
    env["TUTTI_STORE"] = store_url;
    if (!secret.empty()) env["TUTTI_STORE_SECRET"] = secret;
    if (!job_id.empty()) env["TUTTI_JOB_ID"] = job_id;
    if (!o.backend.empty()) env["TUTTI_BACKEND"] = o.backend;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = o.command;
    std::vector<char*> argvp;
    for (auto& s : args) argvp.push_back(s.data());
    argvp.push_back(nullptr);

    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "tutti-run: cannot make the pipes of rank %d: %s\n", r.rank,
                   std::strerror(errno));
      kill_started();
      return 1;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    // stdin: /dev/null (after the pipes, which may have taken descriptor 0). A rank is in a
    // process group of its own, in the background: reading the terminal would stop it
    // (SIGTTIN) and the job would wait for ever.
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    // Nothing else of this launcher's: the store's sockets accepted while ranks start, whatever
    // else lacks close-on-exec.
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Each rank leads its own process group, so ending a rank ends what it started too.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    // The ranks start with the signal dispositions a program expects, as Python's subprocess
    // gives them (restore_signals): SIGPIPE too, which this launcher ignores for itself. tutti
    // never needs it ignored: the Gloo backend ignores it when its first group starts (unless
    // the program handles it), and the TCP store sends with MSG_NOSIGNAL (fault_test
    // CrashSigpipe: Gloo survivors of a peer's death, SIGPIPE at its default). A rank whose
    // output pipe closes (tutti-run gone) still ends as programs do.
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    // A spawned process starts with its parent's CPUs: this launcher takes the rank's share for
    // the spawn and its own back after it.
    if (bind) {
      const cpu_set_t share = share_of(local);
      sched_setaffinity(0, sizeof(share), &share);
    }
    const int rc = posix_spawnp(&r.pid, argvp[0], &actions, &attr, argvp.data(), envp.data());
    if (bind) sched_setaffinity(0, sizeof(allowed), &allowed);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (rc != 0) {
      std::fprintf(stderr, "tutti-run: cannot start '%s': %s\n", argvp[0], std::strerror(rc));
      kill_started();
      return 127;
    }
    r.running = true;
    const std::string prefix = o.prefix ? "[" + std::to_string(r.rank) + "]: " : "";
    streams.push_back({out_pipe[0], stdout, prefix, {}});
    streams.push_back({err_pipe[0], stderr, prefix, {}});
  }

  const auto start = Clock::now();
  std::optional<Clock::time_point> kill_at;  // when still-running ranks get SIGKILL
  std::optional<int> result;                 // the job's exit code, once decided
  int running = o.nproc;
  long failures = 0;  // ranks that failed, up to --max-failures, while the others went on
  std::optional<int> last_failure;  // the exit code of the last rank that failed
  bool any_success = false;
  // Every rank's process group, ended ranks' too: what a rank started may outlive it.
  // (A reaped rank's group, once empty, is not signalled again: its number may be reused.)
  auto stop_all = [&](int sig) {
    for (auto& r : ranks) {
      if (r.pid > 0 && !r.group_gone) kill(-r.pid, sig);
    }
  };
  auto groups_left = [&] {
    bool any = false;
    for (auto& r : ranks) any = (r.pid > 0 && !r.group_emptied()) || any;
    return any;
  };
  // Once every rank has ended: how long their output may stay open (what they started holds it).
  std::optional<Clock::time_point> drain_until;
  int drain_step = 0;                          // 0: waiting, 1: SIGTERM sent, 2: SIGKILL sent
  std::optional<Clock::time_point> signal_at;  // when the first signal was handled
  sig_atomic_t signal_seen = 0;                // signals counted by then (and copies after)

  while (running > 0 ||
         std::any_of(streams.begin(), streams.end(), [](const Stream& s) { return s.fd >= 0; })) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    for (auto& s : streams) {
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        owners.push_back(&s);
      }
    }
    poll(fds.data(), fds.size(), 50);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        owners[k]->forward(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        owners[k]->finish();
      }
    }
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      --running;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed) {
        last_failure = exit_code_of(status);
      } else {
        any_success = true;
      }
      r.group_emptied();
      if (failed && !result && failures < o.max_failures) {
        ++failures;
        std::fprintf(stderr,
                     "tutti-run: rank %d (pid %d) %s; the others go on (%ld of "
                     "--max-failures %ld)\n",
                     r.rank, static_cast<int>(r.pid), describe_status(status).c_str(), failures,
                     o.max_failures);
      } else if (failed && !result) {
        std::fprintf(stderr, "tutti-run: rank %d (pid %d) %s; stopping the other ranks\n", r.rank,
                     static_cast<int>(r.pid), describe_status(status).c_str());
        result = exit_code_of(status);
        stop_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (g_signal != 0 && !signal_at) {
      if (!result) {  // (else the ranks are being stopped already)
        std::fprintf(stderr, "tutti-run: got signal %d; stopping the ranks\n", int(g_signal));
        result = 128 + g_signal;
        stop_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      }
      signal_seen = g_signals;
      signal_at = Clock::now();
    } else if (signal_at && g_signals > signal_seen) {
      // Copies of the first signal (GNU timeout sends it to tutti-run and again to its process
      // group) come within moments: only one a second later is the user's second.
      if (Clock::now() - *signal_at < std::chrono::seconds(1)) {
        signal_seen = g_signals;
      } else if (kill_at) {
        std::fprintf(stderr, "tutti-run: a second signal; killing the ranks\n");
        stop_all(SIGKILL);
        kill_at.reset();
      }
    }
    if (o.timeout_s > 0 && !result && Clock::now() - start > std::chrono::seconds(o.timeout_s)) {
      std::fprintf(stderr, "tutti-run: the job ran past --timeout %ld s; stopping the ranks\n",
                   o.timeout_s);
      result = 124;
      stop_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(5);
    }
    if (kill_at && Clock::now() > *kill_at) {
      stop_all(SIGKILL);
      kill_at.reset();
    }
    // Every rank ended and some output is still open: a process a rank started holds it.
    if (running == 0 && !drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
    if (running == 0 && Clock::now() > *drain_until) {
      if (drain_step == 0 && groups_left()) {
        std::fprintf(stderr,
                     "tutti-run: every rank has ended, and processes they started still hold "
                     "their output; stopping them\n");
        stop_all(SIGTERM);
        drain_step = 1;
        drain_until = Clock::now() + std::chrono::seconds(3);
      } else if (drain_step == 1 && groups_left()) {
        stop_all(SIGKILL);
        drain_step = 2;
        drain_until = Clock::now() + std::chrono::seconds(1);
      } else {
        // Nothing left to stop (or nothing that a SIGKILL ended): what the pipes hold is
        // forwarded, then they close.
        for (auto& st : streams) {
          if (st.fd < 0) continue;
          fcntl(st.fd, F_SETFL, fcntl(st.fd, F_GETFL) | O_NONBLOCK);
          char buf[65536];
          for (int k = 0; k < 64; ++k) {
            const ssize_t n = read(st.fd, buf, sizeof(buf));
            if (n <= 0) break;
            st.forward(buf, static_cast<size_t>(n));
          }
          st.finish();
        }
      }
    }
  }
  if (result) return *result;
  // Failures within --max-failures: the job succeeds when another rank did, else it failed.
  return !any_success && last_failure ? *last_failure : 0;
}
