#include "test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace tutti::testing {

void run_ranks(int world_size, const std::function<void(int rank)>& fn) {
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

std::vector<std::shared_ptr<CollectiveGroup>> create_groups(int world_size,
                                                            const std::string& backend,
                                                            const std::string& name,
                                                            std::chrono::milliseconds timeout,
                                                            std::shared_ptr<Store> store) {
  if (!store) store = std::make_shared<HashStore>(timeout);
  std::vector<std::shared_ptr<CollectiveGroup>> groups(world_size);
  run_ranks(world_size, [&](int rank) {
    GroupOptions options;
    options.store = store;
    options.timeout = timeout;
    groups[rank] = CollectiveGroup::create(world_size, rank, backend, name, options);
  });
  return groups;
}

std::string unique_name(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

std::string symmetric_file_prefix() {
  struct stat st {};
  const unsigned long long ns =
      ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
  return "tutti-sym-" + std::to_string(::getuid()) + "-n" + std::to_string(ns) + "-" +
         std::to_string(::getpid()) + "-";
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tutti-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// Starts one process per argv (each with this process's environment plus its `envs` entries,
// output to a log), waits for all at most `limit`, kills the ones left (a test failure naming
// `labels[k]`), and returns each one's exit status and output.
std::vector<WorkerResult> spawn_and_wait(const std::vector<std::vector<std::string>>& argvs,
                                         const std::vector<std::vector<std::string>>& envs,
                                         const std::vector<std::string>& labels,
                                         std::chrono::milliseconds limit) {
  TempDir logs;
  const size_t n = argvs.size();
  auto log_of = [&](size_t k) { return logs.path() + "/proc" + std::to_string(k); };
  auto pointers = [](std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (auto& s : strings) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
  };
  std::vector<pid_t> pids(n, -1);
  for (size_t k = 0; k < n; ++k) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.push_back(*e);
    env_strings.insert(env_strings.end(), envs[k].begin(), envs[k].end());
    std::vector<std::string> args = argvs[k];
    auto arg_ptrs = pointers(args);
    auto env_ptrs = pointers(env_strings);
    const std::string log = log_of(k);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc =
        posix_spawnp(&pids[k], arg_ptrs[0], &actions, nullptr, arg_ptrs.data(), env_ptrs.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0)
      throw std::runtime_error("posix_spawn of " + args[0] + " failed: " + std::to_string(rc));
  }
  std::vector<WorkerResult> results(n);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t running = n;
  std::vector<bool> done(n, false);
  while (running > 0) {
    for (size_t k = 0; k < n; ++k) {
      if (done[k]) continue;
      int status = 0;
      if (::waitpid(pids[k], &status, WNOHANG) == pids[k]) {
        done[k] = true;
        --running;
        results[k].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        results[k].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
    }
    if (running == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t k = 0; k < n; ++k) {
        if (done[k]) continue;
        ADD_FAILURE() << labels[k] << " overran " << limit.count() << " ms; killed";
        ::kill(pids[k], SIGKILL);
        int status = 0;
        ::waitpid(pids[k], &status, 0);
        done[k] = true;
        results[k].signal = SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t k = 0; k < n; ++k) {
    std::ifstream in(log_of(k));
    std::stringstream ss;
    ss << in.rdbuf();
    results[k].output = ss.str();
  }
  return results;
}

}  // namespace

std::vector<WorkerResult> run_workers(const std::string& scenario, int world_size,
                                      const std::string& store_url, std::chrono::milliseconds limit,
                                      const std::vector<std::string>& extra,
                                      const std::vector<int>& ranks_to_start) {
  return run_workers_of(TUTTI_TEST_WORKER, scenario, world_size, store_url, limit, extra,
                        ranks_to_start);
}

std::vector<WorkerResult> run_workers_of(const std::string& program, const std::string& scenario,
                                         int world_size, const std::string& store_url,
                                         std::chrono::milliseconds limit,
                                         const std::vector<std::string>& extra,
                                         const std::vector<int>& ranks_to_start) {
  std::vector<int> ranks = ranks_to_start;
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> labels;
  for (int rank : ranks) {
    std::vector<std::string> args = {program, scenario, std::to_string(rank),
                                     std::to_string(world_size), store_url};
    args.insert(args.end(), extra.begin(), extra.end());
    argvs.push_back(std::move(args));
    labels.push_back("worker rank " + std::to_string(rank) + " of scenario '" + scenario + "'");
  }
  return spawn_and_wait(argvs, std::vector<std::vector<std::string>>(ranks.size()), labels, limit);
}

std::vector<WorkerResult> run_processes(const std::vector<std::string>& argv,
                                        const std::vector<std::vector<std::string>>& envs,
                                        std::chrono::milliseconds limit) {
  std::vector<std::string> labels;
  for (size_t k = 0; k < envs.size(); ++k) {
    labels.push_back("process " + std::to_string(k) + " (" + argv[0] + ")");
  }
  return spawn_and_wait(std::vector<std::vector<std::string>>(envs.size(), argv), envs, labels,
                        limit);
}

WorkerResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                         const std::vector<std::string>& env) {
  return run_processes(argv, {env}, limit)[0];
}

// A port the kernel's ephemeral range cannot hand out: a port picked by binding port 0 lies in
// that range, and between the pick and the test's own bind another test's listener (bind to
// port 0) or client socket (connect) may be given it (CI saw a Gloo listener take a hosted
// store's port). Below the range only tests that pick a fixed port compete, and the bind check
// here leaves them a random one of ~20000 ports each.
uint16_t free_port() {
  unsigned low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> low;
  const unsigned first = 10000;
  if (low <= first + 1000) return TCPStoreServer("127.0.0.1", 0).port();
  std::mt19937 random(static_cast<unsigned>(::getpid()) ^
                      static_cast<unsigned>(std::random_device{}()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<uint16_t>(first + random() % (low - first));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return port;
  }
  return TCPStoreServer("127.0.0.1", 0).port();
}

RedisServer& RedisServer::instance() {
  static RedisServer server;
  return server;
}

RedisServer& RedisServer::with_password(const std::string& password) {
  static RedisServer server({"--requirepass", password});
  return server;
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

RedisServer::RedisServer(const std::vector<std::string>& extra) {
  if (::access("/usr/bin/redis-server", X_OK) != 0) {
    why_not_ = "redis-server is not installed (apt-get install redis-server)";
    return;
  }
  port_ = free_port();
  const std::string port = std::to_string(port_);
  std::vector<std::string> args = {
      "/usr/bin/redis-server", "--port", port,          "--bind", "127.0.0.1",  "--save", "",
      "--appendonly",          "no",     "--daemonize", "no",     "--loglevel", "warning"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  pid_ = pid;
  if (pid_ <= 0) why_not_ = "could not start redis-server";
}

TuttiStoreProcess::TuttiStoreProcess(const std::vector<std::string>& extra) {
  int out[2];
  if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> args = {TUTTI_STORE_PROGRAM, "--host", "127.0.0.1", "--port", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  out_ = out[0];
  if (rc != 0) throw std::runtime_error("posix_spawn failed");
  pid_ = pid;
  std::string line;
  char c;
  while (::read(out_, &c, 1) == 1 && c != '\n') line.push_back(c);
  const std::string prefix = "tutti-store listening on 127.0.0.1:";
  if (line.rfind(prefix, 0) != 0) throw std::runtime_error("tutti-store said: " + line);
  port_ = static_cast<uint16_t>(std::stoi(line.substr(prefix.size())));
}

TuttiStoreProcess::~TuttiStoreProcess() {
  if (pid_ > 0) stop();
}

int TuttiStoreProcess::stop() {
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  ::close(out_);
  pid_ = -1;
  return status;
}

bool stop_process(pid_t pid, std::chrono::milliseconds timeout) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // "pid (comm) S ...": the state follows the last ')'.
    const size_t close = text.rfind(')');
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

int listen_loopback(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 16) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("listen_loopback: bind/listen failed");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

std::vector<std::string> shm_entries(const std::string& needle) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).find(needle) != std::string::npos) found.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return found;
}

}  // namespace tutti::testing
