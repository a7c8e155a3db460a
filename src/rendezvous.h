// Rendezvous: how the ranks of a group find each other through a store (internal to the core).
//
// Each rank joins an incarnation of the group name, claims its rank there with a record (world
// size, backend, host, pid), and waits for every other rank's record, checking each as it
// arrives, so that ranks disagreeing on world size or backend fail fast.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/options.h"
#include "tutti/store.h"

namespace tutti::detail {

// What each rank publishes when it joins.
struct JoinRecord {
  int world_size = 0;
  std::string backend;  // as asked for ("auto" stays "auto")
  std::string host;     // host_identity()
  long pid = 0;

  std::string encode() const;
  static JoinRecord decode(const std::string& text);
};

// Who met: this incarnation's key prefix in the store and every rank's record.
struct Membership {
  int64_t incarnation = 0;
  std::string scope;
  std::vector<JoinRecord> ranks;  // by rank

  std::vector<std::string> hosts() const;
  std::vector<long> pids() const;
};

// The store a group meets through, as GroupOptions says: the given object, a URL opened (rank 0
// hosts a tcp:// store), the launcher's (env://), or, for a group of one, a private HashStore.
struct StoreChoice {
  std::shared_ptr<Store> store;
  bool owned = false;  // opened from a URL for this group
  std::string job_id;  // what scopes the group's keys (may be empty)
};
StoreChoice resolve_store(const GroupOptions& options, int world_size, int rank);

// The store key every incarnation of group `name` of job `job_id` lives under.
std::string group_base(const std::string& job_id, const std::string& name);

// Joins `base`'s next incarnation as `rank` and waits up to `timeout` for the other ranks.
// Throws kTimeout naming the missing ranks, kInvalidArgument for a rank that disagrees on world
// size or backend, kInvalidUsage for a rank claimed by another process. Messages are not
// prefixed with the group: the caller does that.
Membership meet(Store& store, const std::string& base, int world_size, int rank,
                const JoinRecord& mine, std::chrono::milliseconds timeout);

}  // namespace tutti::detail
