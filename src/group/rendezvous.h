// Rendezvous: how the ranks of a group find each other through a store (internal to the core).
//
// Each init of a group name forms an incarnation, numbered by rank 0: rank 0 takes the next
// number from a counter and publishes it as the current one; the other ranks join the current
// incarnation, claim their rank there with a record (world size, backend, host, pid), and every
// rank waits for every other rank's record, checking each as it arrives, so that ranks that
// disagree on world size or backend fail fast. An incarnation that formed, or that failed (a rank
// timed out or disagreed), is never joined again: a rank arriving there waits for rank 0 to start
// the next one. A rank that fails gives its claim back. So a failed init, a world-size change or
// a crash never stops a later init of the same name on a long-lived store from forming.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/options.h"
#include "tutti/store.h"

namespace tutti::detail {

// What each rank publishes when it joins.
struct JoinRecord {
  int world_size = 0;
  std::string backend;  // as asked for ("auto" stays "auto")
  std::string host;     // host_identity()
  long pid = 0;
  uint64_t start = 0;  // the process's start time (process_start_time)
  uint64_t nonce = 0;  // random: tells two joins of one process apart (ranks as threads)
  bool left = false;   // the rank's group was destroyed: the record names no live member
  uint64_t pidns = 0;  // the process's pid namespace (pid_namespace(); 0: unknown)

  // The start time where `pid` means the same process to this one (on `my_host`, the caller's
  // host_identity(), and in its pid namespace), else 0 (unknown): what a group keeps to tell a
  // rank's exit by.
  uint64_t start_seen_from(const std::string& my_host) const;

  // A record for this process (host, pid, start time, a fresh nonce).
  static JoinRecord mine(int world_size, const std::string& backend);

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

// Joins the incarnation of `base` that rank 0 forms (rank 0: forms the next one) as `rank`, and
// waits up to `timeout` for the other ranks. Throws kTimeout naming the missing ranks,
// kInvalidArgument for a rank that disagrees on world size or backend, kInvalidUsage for a rank
// that another live process claimed. Messages are not prefixed with the group: the caller does
// that.
Membership meet(Store& store, const std::string& base, int world_size, int rank,
                const JoinRecord& mine, std::chrono::milliseconds timeout);

// The round after each rank made its backend: a rank says its backend is up (`failure` empty)
// or why it failed, and one whose backend is up waits until every rank's is. So no rank returns
// from init or split, and may destroy the group and close its connections, while another is still
// connecting to it; and a rank whose backend failed fails the others that reached this round at
// once (kRemoteError, naming it and why) instead of at their timeout (a rank still inside its
// own backend's making, waiting on the failed one, learns at that backend's timeout). kTimeout
// names the ranks not up, and is published too: a rank that comes up later fails with
// kRemoteError rather than take the group for formed. Returns at once for a failure (the
// caller rethrows its own error). Messages are not prefixed with the group: the caller does
// that.
// `linger`: how long a rank that publishes a failure waits for the others to be done with the
// store (each writes settled_key once its init failed and it gave its rank back): the rank that
// hosts the store, whose departure stops it (they would learn only that it is gone).
void settle_backends(Store& store, const std::string& scope, int world_size, int rank,
                     const std::string& failure, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds linger = std::chrono::milliseconds(0));

// kRemoteError "failed on rank r: why" once a rank said in that round that its backend failed
// (or gave up waiting), else nothing.
std::optional<Error> backend_failed(Store& store, const std::string& scope);

// Where a rank whose init failed says it is done with the store.
std::string settled_key(const std::string& scope, int rank);

// What a rank's group does when destroyed: marks its record as left (so it is never taken for
// a live member) and forgets the join. May throw the store's errors; forget_join alone never.
void leave(Store& store, const std::string& scope, int rank, const JoinRecord& mine);
void forget_join(const JoinRecord& mine);

// Where an incarnation's own keys are noted (see store/ledger_store.h).
std::string ledger_of(const std::string& scope);

// Deletes the keys of every incarnation of `base` before `below` not deleted yet: what their
// ledgers list, their ranks' claims and departure notes, their state. Rank 0 calls it when it
// destroys incarnation `below`, which formed, so no rank uses the earlier ones any more. Returns
// how many keys it deleted; may throw the store's errors.
size_t purge_incarnations(Store& store, const std::string& base, int64_t below, int world_size);

}  // namespace tutti::detail
