// What the fault tests share (internal to the tests): the fault worker's runs, their checks, and
// the destroy/re-create cycles on each store kind.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

namespace tutti::testing {

inline std::vector<WorkerResult> run(const std::string& scenario, int world,
                                     const std::string& store, std::chrono::milliseconds limit,
                                     const std::vector<std::string>& extra = {}) {
  return run_workers_of(TUTTI_FAULT_WORKER, scenario, world, store, limit, extra);
}

// Every rank exited 0; prints the figures they measured.
inline void expect_all_ok(const std::vector<WorkerResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (signal " << results[r].signal << "):\n"
                                       << results[r].output;
    std::regex figure("FIGURE [^\n]*");
    for (auto it = std::sregex_iterator(results[r].output.begin(), results[r].output.end(), figure);
         it != std::sregex_iterator(); ++it) {
      std::printf("rank %zu %s\n", r, it->str().c_str());
    }
  }
}

// A store of `kind` for a test: file (in `dir`), tcp_hosted (rank 0 hosts it), redis (the
// shared test server: the caller skips first where it is not there) or tutti_store (a
// tutti-store process, kept in `process`); its URL.
inline std::string test_store_url(const std::string& kind, const TempDir& dir,
                                  std::unique_ptr<TuttiStoreProcess>& process) {
  if (kind == "file") return "file://" + dir.path() + "/store";
  if (kind == "tcp_hosted") return "tcp://127.0.0.1:" + std::to_string(free_port());
  if (kind == "redis") return "redis://127.0.0.1:" + std::to_string(RedisServer::instance().port());
  process = std::make_unique<TuttiStoreProcess>();
  return "tcp://127.0.0.1:" + std::to_string(process->port());
}

// `cycles` destroy/re-create cycles of a 2-rank group under one name on `backend`, through a
// store of `kind` (file, tcp_hosted, redis, tutti_store): every rank ends well, with fds,
// threads and RSS flat (the worker checks), and nothing left in /dev/shm.
inline void run_cycles(const std::string& backend, const std::string& kind, int cycles) {
  auto& redis = RedisServer::instance();
  if (kind == "redis" && !redis.available()) GTEST_SKIP() << redis.why_not();
  TempDir dir;
  std::unique_ptr<TuttiStoreProcess> tutti_store;
  const std::string url = test_store_url(kind, dir, tutti_store);
  const std::string name = unique_name("cycled");
  expect_all_ok(run("cycles", 2, url, std::chrono::milliseconds(60000 + 100 * cycles),
                    {"backend=" + backend, "cycles=" + std::to_string(cycles), "warm=50",
                     "store_kind=" + kind, "name=" + name, "job=" + name, "timeout=10000"}));
  EXPECT_TRUE(shm_entries(name).empty()) << "left in /dev/shm: " << shm_entries(name)[0];
}

}  // namespace tutti::testing
