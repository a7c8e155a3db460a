#include "rendezvous.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "group_util.h"
#include "tutti/env.h"
#include "tutti/error.h"
#include "tutti/hash_store.h"
#include "tutti/op_type.h"

namespace tutti::detail {

std::string JoinRecord::encode() const {
  return std::to_string(world_size) + "\n" + backend + "\n" + host + "\n" + std::to_string(pid);
}

JoinRecord JoinRecord::decode(const std::string& text) {
  JoinRecord r;
  std::istringstream in(text);
  std::string ws, pid;
  std::getline(in, ws);
  std::getline(in, r.backend);
  std::getline(in, r.host);
  std::getline(in, pid);
  r.world_size = std::atoi(ws.c_str());
  r.pid = std::atol(pid.c_str());
  return r;
}

std::vector<std::string> Membership::hosts() const {
  std::vector<std::string> out;
  for (const auto& r : ranks) out.push_back(r.host);
  return out;
}

std::vector<long> Membership::pids() const {
  std::vector<long> out;
  for (const auto& r : ranks) out.push_back(r.pid);
  return out;
}

StoreChoice resolve_store(const GroupOptions& options, int world_size, int rank) {
  StoreChoice choice;
  choice.store = options.store;
  choice.job_id = options.job_id;
  std::string url = options.store_url;
  if (!choice.store && (url == "env://" || (url.empty() && world_size > 1 && has_launch_env()))) {
    const LaunchEnv env = read_launch_env();
    url = env.store_url;
    if (choice.job_id.empty()) choice.job_id = env.job_id;
  }
  if (!choice.store && !url.empty()) {
    // Rank 0 hosts a tcp:// store (unless another process already serves the address).
    choice.store = open_store(url, options.timeout, /*host=*/rank == 0);
    choice.owned = true;
  }
  if (!choice.store) {
    if (world_size > 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "a group of " + std::to_string(world_size) +
                      " ranks needs a store to meet through: set GroupOptions::store (e.g. a "
                      "shared HashStore for threads) or GroupOptions::store_url (e.g. "
                      "tcp://HOST:PORT, hosted by rank 0, or file:///tmp/job.store), or launch "
                      "with tutti-run, torchrun, srun or mpirun (env://)");
    }
    choice.store = std::make_shared<HashStore>(options.timeout);
  }
  if (choice.job_id.empty()) {
    if (const char* env_job = std::getenv("TUTTI_JOB_ID")) choice.job_id = env_job;
  }
  if (choice.job_id.empty() && choice.store->check({"tutti/store-nonce"})) {
    choice.job_id = choice.store->get("tutti/store-nonce");
  }
  return choice;
}

std::string group_base(const std::string& job_id, const std::string& name) {
  return "tutti/" + (job_id.empty() ? std::string() : "job/" + escape_name(job_id) + "/") +
         "group/" + escape_name(name);
}

Membership meet(Store& store, const std::string& base, int world_size, int rank,
                const JoinRecord& mine, std::chrono::milliseconds timeout) {
  // Incarnation: every init of this name through this store takes the next join number, and
  // world_size consecutive joins form one incarnation, so keys of a destroyed incarnation are
  // never read by the next one.
  const int64_t join = store.add(base + "/joins", 1);
  Membership m;
  m.incarnation = (join - 1) / world_size;
  m.scope = base + "/" + std::to_string(m.incarnation);
  m.ranks.resize(world_size);
  m.ranks[rank] = mine;

  const std::string my_key = m.scope + "/rank/" + std::to_string(rank);
  const std::string claimed = store.compare_set(my_key, "", mine.encode());
  if (claimed != mine.encode()) {
    const JoinRecord other = JoinRecord::decode(claimed);
    throw Error(ErrorCode::kInvalidUsage,
                "rank " + std::to_string(rank) + " is already claimed by process " +
                    std::to_string(other.pid) + " on host '" + other.host +
                    "': two processes were given the same rank");
  }

  // Meet: every other rank's record, each checked as soon as it arrives.
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(m.scope + "/rank/" + std::to_string(r));
  const auto deadline = deadline_after(timeout);
  std::vector<bool> seen(world_size, false);
  seen[rank] = true;
  int missing_count = world_size - 1;
  auto pause = std::chrono::milliseconds(1);
  while (missing_count > 0) {
    int first_missing = -1;
    for (int r = 0; r < world_size; ++r) {
      if (seen[r]) continue;
      if (!store.check({keys[r]})) {
        if (first_missing < 0) first_missing = r;
        continue;
      }
      const JoinRecord other = JoinRecord::decode(store.get(keys[r]));
      if (other.world_size != world_size) {
        throw Error(ErrorCode::kInvalidArgument,
                    "rank " + std::to_string(r) + " joined with world size " +
                        std::to_string(other.world_size) + ", this rank with " +
                        std::to_string(world_size));
      }
      if (other.backend != mine.backend) {
        throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(r) +
                                                     " joined with backend '" + other.backend +
                                                     "', this rank with '" + mine.backend + "'");
      }
      m.ranks[r] = other;
      seen[r] = true;
      --missing_count;
    }
    if (missing_count == 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string missing;
      for (int r = 0; r < world_size; ++r) {
        if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error(ErrorCode::kTimeout,
                  "timed out after " + std::to_string(timeout.count()) + " ms: " +
                      std::to_string(world_size - missing_count) + " of " +
                      std::to_string(world_size) + " ranks arrived; missing rank(s) " + missing);
    }
    // Sleep in the store until the first missing rank arrives (or a short while passes).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    try {
      store.wait({keys[first_missing]},
                 std::max(std::chrono::milliseconds(1), std::min(pause, left)));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
    }
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  return m;
}

}  // namespace tutti::detail
