// Helpers shared by tutti's tests: ranks as threads, ranks as processes, unique names.
#pragma once

#include <gtest/gtest.h>

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sanitizers.h"
#include "tutti/tutti.h"

namespace tutti::testing {

// Runs fn(rank) on world_size threads and waits for all; an exception escaping a rank becomes a
// test failure naming the rank.
void run_ranks(int world_size, const std::function<void(int rank)>& fn);

// Creates one group per rank concurrently (ranks as threads) over a shared HashStore.
std::vector<std::shared_ptr<CollectiveGroup>> create_groups(
    int world_size, const std::string& backend, const std::string& name,
    std::chrono::milliseconds timeout = std::chrono::seconds(30),
    std::shared_ptr<Store> store = nullptr);

// A name unique within this process run: "<prefix>-<pid>-<counter>".
std::string unique_name(const std::string& prefix);

// "tutti-sym-<uid>-n<pid namespace>-<pid>-": how the names of this process's symmetric memory
// begin in /dev/shm (the pid namespace read from /proc/self/ns/pid, as the backend does).
std::string symmetric_file_prefix();

// A fresh temporary directory, removed with its contents when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The result of one worker process started by run_workers.
struct WorkerResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Starts `world_size` processes of the tutti_test_worker helper as
// `tutti_test_worker <scenario> <rank> <world_size> <store_url> [extra...]` (an exec, never a fork
// of this process, which may run Gloo threads), waits at most `limit` for all, kills any left,
// and returns each rank's result. Fails the test on a worker that overran the limit.
std::vector<WorkerResult> run_workers(const std::string& scenario, int world_size,
                                      const std::string& store_url, std::chrono::milliseconds limit,
                                      const std::vector<std::string>& extra = {},
                                      const std::vector<int>& ranks = {});

// run_workers for another worker program taking the same arguments (e.g. TUTTI_FAULT_WORKER).
std::vector<WorkerResult> run_workers_of(const std::string& program, const std::string& scenario,
                                         int world_size, const std::string& store_url,
                                         std::chrono::milliseconds limit,
                                         const std::vector<std::string>& extra = {},
                                         const std::vector<int>& ranks = {});

// Runs a command line to completion (at most `limit`), returning its exit status and output.
// `env` adds "NAME=value" entries to this process's environment for the child.
WorkerResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                         const std::vector<std::string>& env = {});

// Starts one process per entry of `envs` running argv with that extra environment, and waits
// for all (at most `limit`).
std::vector<WorkerResult> run_processes(const std::vector<std::string>& argv,
                                        const std::vector<std::vector<std::string>>& envs,
                                        std::chrono::milliseconds limit);

// A TCP port that was free a moment ago (for tests of launchers that take a fixed port).
uint16_t free_port();

// This process's resident memory, bytes (/proc/self/statm).
size_t rss_bytes();

// Entries of /dev/shm whose name contains `needle`.
std::vector<std::string> shm_entries(const std::string& needle);

// A TCP socket listening on a loopback port it picked (returned in `port`); throws
// std::runtime_error when it cannot.
int listen_loopback(uint16_t& port);

// Sends SIGSTOP to `pid` and returns once the kernel shows it stopped ('T' in /proc/<pid>/stat),
// at most `timeout` (false then): kill() returns before a running target has stopped.
bool stop_process(pid_t pid, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

// A real redis-server on a free loopback port for this test process, stopped at exit.
class RedisServer {
 public:
  static RedisServer& instance();
  // A second server that requires a password.
  static RedisServer& with_password(const std::string& password);
  bool available() const { return pid_ > 0; }
  uint16_t port() const { return port_; }
  const std::string& why_not() const { return why_not_; }
  ~RedisServer();

 private:
  explicit RedisServer(const std::vector<std::string>& extra = {});
  int pid_ = -1;
  uint16_t port_ = 0;
  std::string why_not_;
};

// A tutti-store process serving on a free loopback port until stop() (or destruction).
class TuttiStoreProcess {
 public:
  explicit TuttiStoreProcess(const std::vector<std::string>& extra = {});
  ~TuttiStoreProcess();
  uint16_t port() const { return port_; }
  // SIGTERM, then the exit status.
  int stop();

 private:
  int pid_ = -1;
  int out_ = -1;
  uint16_t port_ = 0;
};

// Expects f() to throw tutti::Error with `code` and returns it, for more checks of its message
// (a failure, and an Error of code kInternal, when it throws none).
template <typename F>
Error expect_error(F&& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected an error with code " << static_cast<int>(code);
  return Error(ErrorCode::kInternal, "none");
}

// Expects fn to throw tutti::Error with the given code and a message containing every needle.
#define EXPECT_TUTTI_ERROR(stmt, error_code, ...)                                \
  do {                                                                           \
    try {                                                                        \
      stmt;                                                                      \
      ADD_FAILURE() << "expected tutti::Error from: " #stmt;                     \
    } catch (const ::tutti::Error& e_) {                                         \
      EXPECT_EQ(e_.code(), error_code) << e_.what();                             \
      for (const std::string& needle_ : std::vector<std::string>{__VA_ARGS__}) { \
        EXPECT_NE(std::string(e_.what()).find(needle_), std::string::npos)       \
            << "message lacks '" << needle_ << "': " << e_.what();               \
      }                                                                          \
    }                                                                            \
  } while (0)

}  // namespace tutti::testing
