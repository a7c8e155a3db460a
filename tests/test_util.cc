#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
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

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tutti-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<WorkerResult> run_workers(const std::string& scenario, int world_size,
                                      const std::string& store_url,
                                      std::chrono::milliseconds limit,
                                      const std::vector<std::string>& extra,
                                      const std::vector<int>& ranks_to_start) {
  TempDir logs;
  std::vector<int> ranks = ranks_to_start;
  if (ranks.empty()) {
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
  }
  std::vector<pid_t> pids(ranks.size(), -1);
  for (size_t k = 0; k < ranks.size(); ++k) {
    std::vector<std::string> args = {TUTTI_TEST_WORKER, scenario, std::to_string(ranks[k]),
                                     std::to_string(world_size), store_url};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = logs.path() + "/worker" + std::to_string(k);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pids[k], TUTTI_TEST_WORKER, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
  }
  std::vector<WorkerResult> results(ranks.size());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t running = ranks.size();
  std::vector<bool> done(ranks.size(), false);
  while (running > 0) {
    for (size_t k = 0; k < ranks.size(); ++k) {
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
      for (size_t k = 0; k < ranks.size(); ++k) {
        if (done[k]) continue;
        ADD_FAILURE() << "worker rank " << ranks[k] << " of scenario '" << scenario
                      << "' overran " << limit.count() << " ms; killed";
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
  for (size_t k = 0; k < ranks.size(); ++k) {
    std::ifstream in(logs.path() + "/worker" + std::to_string(k));
    std::stringstream ss;
    ss << in.rdbuf();
    results[k].output = ss.str();
  }
  return results;
}

namespace {
std::vector<char*> to_argv(std::vector<std::string>& args) {
  std::vector<char*> out;
  for (auto& a : args) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}
}  // namespace

std::vector<WorkerResult> run_processes(const std::vector<std::string>& argv,
                                        const std::vector<std::vector<std::string>>& envs,
                                        std::chrono::milliseconds limit) {
  TempDir logs;
  std::vector<pid_t> pids(envs.size(), -1);
  for (size_t k = 0; k < envs.size(); ++k) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.push_back(*e);
    env_strings.insert(env_strings.end(), envs[k].begin(), envs[k].end());
    std::vector<std::string> args = argv;
    auto arg_ptrs = to_argv(args);
    auto env_ptrs = to_argv(env_strings);
    const std::string log = logs.path() + "/proc" + std::to_string(k);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawnp(&pids[k], arg_ptrs[0], &actions, nullptr, arg_ptrs.data(),
                                env_ptrs.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
  }
  std::vector<WorkerResult> results(envs.size());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (size_t k = 0; k < envs.size(); ++k) {
    int status = 0;
    while (::waitpid(pids[k], &status, WNOHANG) != pids[k]) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "process " << k << " (" << argv[0] << ") overran " << limit.count()
                      << " ms; killed";
        ::kill(pids[k], SIGKILL);
        ::waitpid(pids[k], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    results[k].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    results[k].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    std::ifstream in(logs.path() + "/proc" + std::to_string(k));
    std::stringstream ss;
    ss << in.rdbuf();
    results[k].output = ss.str();
  }
  return results;
}

WorkerResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                         const std::vector<std::string>& env) {
  return run_processes(argv, {env}, limit)[0];
}

uint16_t free_port() { return TCPStoreServer("127.0.0.1", 0).port(); }

}  // namespace tutti::testing
