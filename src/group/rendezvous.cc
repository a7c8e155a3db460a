#include "group/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "group/group_util.h"
#include "store/ledger_store.h"
#include "tutti/env.h"
#include "tutti/error.h"
#include "tutti/hash_store.h"
#include "tutti/op_type.h"
#include "util/deadline.h"
#include "util/host_identity.h"

namespace tutti::detail {

JoinRecord JoinRecord::mine(int world_size, const std::string& backend) {
  JoinRecord r;
  r.world_size = world_size;
  r.backend = backend;
  r.host = host_identity();
  r.pid = static_cast<long>(::getpid());
  r.start = process_start_time(r.pid);
  r.pidns = pid_namespace();
  std::random_device rd;
  r.nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return r;
}

std::string JoinRecord::encode() const {
  return std::to_string(world_size) + "\n" + backend + "\n" + host + "\n" + std::to_string(pid) +
         "\n" + std::to_string(start) + "\n" + std::to_string(nonce) + (left ? "\nleft" : "\n-") +
         "\n" + std::to_string(pidns);
}

uint64_t JoinRecord::start_seen_from(const std::string& my_host) const {
  static const uint64_t mine = pid_namespace();
  return pidns != 0 && pidns == mine && host == my_host ? start : 0;
}

JoinRecord JoinRecord::decode(const std::string& text) {
  JoinRecord r;
  std::istringstream in(text);
  std::string ws, pid, start, nonce, left, pidns;
  std::getline(in, ws);
  std::getline(in, r.backend);
  std::getline(in, r.host);
  std::getline(in, pid);
  std::getline(in, start);
  std::getline(in, nonce);
  std::getline(in, left);
  std::getline(in, pidns);
  r.left = left == "left";
  r.pidns = std::strtoull(pidns.c_str(), nullptr, 10);
  r.world_size = std::atoi(ws.c_str());
  r.pid = std::atol(pid.c_str());
  r.start = std::strtoull(start.c_str(), nullptr, 10);
  r.nonce = std::strtoull(nonce.c_str(), nullptr, 10);
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

namespace {

using Clock = std::chrono::steady_clock;

// An incarnation's state: "formed <world size>" once every rank arrived, or "failed\n<code>\n
// <rank>\n<nonce>\n<why>" once a rank gave up on it (nonce: the join record it disagreed with,
// or 0); none while it forms.
std::string formed(int world_size) {
  return "formed " + std::to_string(world_size);
}

struct State {
  bool formed = false;
  int world_size = 0;  // formed: how many ranks it has
  bool failed = false;
  ErrorCode code = ErrorCode::kTimeout;  // failed: how the rank that gave up failed
  int rank = 0;
  uint64_t about = 0;  // failed: the nonce of the join it disagreed with (0: none)
  std::string why;
};

std::optional<State> read_state(Store& store, const std::string& scope) {
  const std::string key = scope + "/state";
  if (!store.check({key})) return std::nullopt;
  const std::string text = store.get(key);
  State st;
  if (text.rfind("formed ", 0) == 0) {
    st.formed = true;
    st.world_size = std::atoi(text.c_str() + 7);
    return st;
  }
  std::istringstream in(text);
  std::string tag, code, rank, about;
  std::getline(in, tag);
  std::getline(in, code);
  std::getline(in, rank);
  std::getline(in, about);
  std::getline(in, st.why, '\0');
  st.failed = true;
  st.code = static_cast<ErrorCode>(std::atoi(code.c_str()));
  st.rank = std::atoi(rank.c_str());
  st.about = std::strtoull(about.c_str(), nullptr, 10);
  return st;
}

std::string scope_of(const std::string& base, int64_t incarnation) {
  return base + "/" + std::to_string(incarnation);
}

std::string rank_key(const std::string& scope, int rank) {
  return scope + "/rank/" + std::to_string(rank);
}

std::string describe(const JoinRecord& r) {
  return "process " + std::to_string(r.pid) + " on host '" + r.host + "'";
}

// The joins of this process whose groups live (or are being made): a claim by this process
// that is not among them is left from an earlier group of the same name.
struct LiveJoins {
  std::mutex mutex;
  std::set<uint64_t> nonces;
};

LiveJoins& live_joins() {
  static auto* joins = new LiveJoins();  // leaked: groups may be destroyed at exit
  return *joins;
}

// Another join that is certainly alive now: a live group of this very process (ranks as
// threads), or a process of this host whose pid and start time still match.
bool live_elsewhere(const JoinRecord& other, const JoinRecord& mine) {
  if (other.left || other.host != mine.host) return false;
  if (other.pid == mine.pid) {
    if (other.nonce == mine.nonce) return false;
    std::lock_guard<std::mutex> lock(live_joins().mutex);
    return live_joins().nonces.count(other.nonce) != 0;
  }
  return other.start != 0 && process_start_time(other.pid) == other.start;
}

// Doubling pauses between looks at the store, 1 ms to 200 ms.
class Backoff {
 public:
  std::chrono::milliseconds next(Clock::time_point deadline) {
    const auto left = time_left(deadline);
    const auto pause = std::max(std::chrono::milliseconds(1), std::min(pause_, left));
    pause_ = std::min(pause_ * 2, std::chrono::milliseconds(200));
    return pause;
  }

 private:
  std::chrono::milliseconds pause_{1};
};

// Sleeps in the store until `key` exists, or `pause` passes.
void nap_on(Store& store, const std::string& key, std::chrono::milliseconds pause) {
  try {
    store.wait({key}, pause);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
  }
}

int64_t read_incarnation(Store& store, const std::string& base) {
  return std::atoll(store.get(base + "/current").c_str());
}

// The store as a meeting uses it, noting whether a call of it failed: once the store cannot be
// reached (its host is gone), the best-effort writes of a failing rank are skipped instead of each
// waiting out the store's timeout again (a rank once took three of them past its own deadline).
class WatchedStore : public Store {
 public:
  explicit WatchedStore(Store& inner) : Store(inner.timeout()), inner_(inner) {}
  bool failed() const { return failed_; }

  void set(const std::string& k, const std::string& v) override {
    watch([&] { inner_.set(k, v); });
  }
  std::string get(const std::string& k) override {
    return watch([&] { return inner_.get(k); });
  }
  int64_t add(const std::string& k, int64_t d) override {
    return watch([&] { return inner_.add(k, d); });
  }
  std::string compare_set(const std::string& k, const std::string& e,
                          const std::string& d) override {
    return watch([&] { return inner_.compare_set(k, e, d); });
  }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    watch([&] { inner_.wait(keys, t); });
  }
  bool check(const std::vector<std::string>& keys) override {
    return watch([&] { return inner_.check(keys); });
  }
  bool delete_key(const std::string& k) override {
    return watch([&] { return inner_.delete_key(k); });
  }
  int64_t num_keys() override {
    return watch([&] { return inner_.num_keys(); });
  }

 private:
  template <typename Fn>
  auto watch(Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const Error& e) {
      // A wait that times out is the meeting's own business; anything else is the store's.
      if (!(e.code() == ErrorCode::kTimeout &&
            std::string(e.what()).find("could not connect") == std::string::npos &&
            std::string(e.what()).find("could not be reached") == std::string::npos)) {
        failed_ = true;
      }
      throw;
    }
  }
  Store& inner_;
  bool failed_ = false;
};

class Meeting {
 public:
  Meeting(Store& store, const std::string& base, int world_size, int rank, const JoinRecord& mine,
          std::chrono::milliseconds timeout)
      : store_(store),
        base_(base),
        world_size_(world_size),
        rank_(rank),
        mine_(mine),
        me_(mine.encode()),
        timeout_(timeout),
        deadline_(deadline_after(timeout)) {}

  Membership run() {
    if (rank_ == 0) {
      // Rank 0 numbers the incarnations: a number only this call holds, so its claim is free.
      incarnation_ = store_.add(base_ + "/incarnations", 1);
      store_.set(rank_key(scope_of(base_, incarnation_), 0), me_);
      store_.set(base_ + "/current", std::to_string(incarnation_));
      claimed_ = true;
      if (auto m = gather()) return *m;
      throw Error(ErrorCode::kInternal, "rank 0 lost its own incarnation");
    }
    while (true) {
      join_current();
      if (auto m = gather()) return *m;  // else a newer incarnation began: join that one
    }
  }

 private:
  // Rank > 0: claims this rank in the incarnation rank 0 forms now.
  void join_current() {
    Backoff backoff;
    while (true) {
      while (!store_.check({base_ + "/current"})) {
        if (Clock::now() >= deadline_) {
          timed_out(
              "rank 0 has not started the group (it numbers each incarnation): missing "
              "rank(s) 0");
        }
        nap_on(store_, base_ + "/current", backoff.next(deadline_));
      }
      incarnation_ = read_incarnation(store_, base_);
      const std::string scope = scope_of(base_, incarnation_);
      const std::string claimed = store_.compare_set(rank_key(scope, rank_), "", me_);
      if (claimed == me_) {
        claimed_ = true;
        const auto st = read_state(store_, scope);
        // Still forming, or it formed as this rank claimed (a formed incarnation's slots below
        // its world size are never free: they hold a member's record, marked when it left).
        if (!st || (st->formed && rank_ < st->world_size)) return;
        give_back();  // an earlier init's (or a failed one): rank 0 starts the next
        if (st->failed && st->about == mine_.nonce) {
          // It failed between this claim and the look at its state, over this very join (rank 0
          // read the record and disagreed): fail as the other ranks do, not at the timeout.
          throw Error(st->code, gave_up(*st) + ": " + st->why);
        }
        wait_for_next(st->failed
                          ? gave_up(*st) + " (" + st->why + ") and rank 0 has not started the next"
                          : "incarnation " + std::to_string(incarnation_) +
                                " formed without this rank (an earlier init's) and rank 0 "
                                "has not started the next: missing rank(s) 0");
        continue;
      }
      const JoinRecord other = JoinRecord::decode(claimed);
      if (live_elsewhere(other, mine_)) {
        throw Error(ErrorCode::kInvalidUsage, "rank " + std::to_string(rank_) +
                                                  " is already claimed by " + describe(other) +
                                                  ": two processes were given the same rank");
      }
      // A claim of an earlier init (its process gone or done, or on another host): wait for
      // the incarnation rank 0 starts now.
      wait_for_next("rank " + std::to_string(rank_) + " of incarnation " +
                    std::to_string(incarnation_) + " is claimed by " + describe(other) +
                    " and rank 0 has not started a new incarnation (two processes given rank " +
                    std::to_string(rank_) + ", or one left from an earlier attempt)");
    }
  }

  // "rank 2 gave up on incarnation 5": who failed the claimed incarnation.
  std::string gave_up(const State& st) const {
    return "rank " + std::to_string(st.rank) + " gave up on incarnation " +
           std::to_string(incarnation_);
  }

  // Waits until rank 0 makes another incarnation current.
  void wait_for_next(const std::string& why) {
    const int64_t seen = incarnation_;
    Backoff backoff;
    while (read_incarnation(store_, base_) == seen) {
      if (Clock::now() >= deadline_) timed_out(why);
      std::this_thread::sleep_for(backoff.next(deadline_));
    }
  }

  // Waits for every rank's record in the claimed incarnation, checking each as it arrives.
  // Empty when rank 0 began a newer incarnation meanwhile (the claim is given back).
  std::optional<Membership> gather() {
    const std::string scope = scope_of(base_, incarnation_);
    Membership m;
    m.incarnation = incarnation_;
    m.scope = scope;
    m.ranks.resize(world_size_);
    m.ranks[rank_] = mine_;
    std::vector<bool> seen(world_size_, false);
    seen[rank_] = true;
    int missing = world_size_ - 1;
    Backoff backoff;
    try {
      while (missing > 0) {
        int first_missing = -1;
        for (int r = 0; r < world_size_; ++r) {
          if (seen[r]) continue;
          const std::string key = rank_key(scope, r);
          const std::string value = store_.check({key}) ? store_.get(key) : std::string();
          if (value.empty()) {  // not here yet, or given back
            if (first_missing < 0) first_missing = r;
            continue;
          }
          check_agrees(r, JoinRecord::decode(value));
          m.ranks[r] = JoinRecord::decode(value);
          seen[r] = true;
          --missing;
        }
        if (missing == 0) break;
        if (const auto st = read_state(store_, scope); st && st->failed) {
          // Another rank gave up on this incarnation. One that timed out: a later rank waits for
          // rank 0's next try; anything else (a disagreement) fails every rank, saying why.
          const std::string why = gave_up(*st) + ": " + st->why;
          if (st->code == ErrorCode::kTimeout && rank_ != 0) {
            give_back();
            return std::nullopt;
          }
          throw Error(st->code, why);
        }
        const int64_t current = read_incarnation(store_, base_);
        if (current != incarnation_) {
          if (rank_ != 0) {
            give_back();
            return std::nullopt;
          }
          const std::string other = store_.get(rank_key(scope_of(base_, current), 0));
          fail(ErrorCode::kInvalidUsage,
               "rank 0 is already claimed by " + describe(JoinRecord::decode(other)) +
                   ", which started incarnation " + std::to_string(current) +
                   " while this process formed incarnation " + std::to_string(incarnation_) +
                   ": two processes were given rank 0");
        }
        if (Clock::now() >= deadline_) {
          std::string names;
          for (int r = 0; r < world_size_; ++r) {
            if (!seen[r]) names += (names.empty() ? "" : ", ") + std::to_string(r);
          }
          fail(ErrorCode::kTimeout, std::to_string(world_size_ - missing) + " of " +
                                        std::to_string(world_size_) +
                                        " ranks arrived; missing rank(s) " + names);
        }
        nap_on(store_, rank_key(scope, first_missing), backoff.next(deadline_));
      }
    } catch (const Error&) {
      give_back();
      throw;
    }
    // Formed: no later init joins it again.
    store_.compare_set(scope + "/state", "", formed(world_size_));
    return m;
  }

  void check_agrees(int r, const JoinRecord& other) {
    if (other.world_size != world_size_) {
      fail(ErrorCode::kInvalidArgument,
           "rank " + std::to_string(r) + " joined with world size " +
               std::to_string(other.world_size) + ", this rank with " + std::to_string(world_size_),
           other.nonce);
    }
    if (other.backend != mine_.backend) {
      fail(ErrorCode::kInvalidArgument,
           "rank " + std::to_string(r) + " joined with backend '" + other.backend +
               "', this rank with '" + mine_.backend + "'",
           other.nonce);
    }
  }

  // Gives up on the incarnation: marks it failed, so no later init joins it.
  // `about`: the nonce of the join this rank disagreed with (that rank fails at once, even if it
  // looks at the state only after it failed).
  [[noreturn]] void fail(ErrorCode code, const std::string& what, uint64_t about = 0) {
    if (claimed_ && !store_.failed()) {
      try {
        store_.compare_set(scope_of(base_, incarnation_) + "/state", "",
                           "failed\n" + std::to_string(static_cast<int>(code)) + "\n" +
                               std::to_string(rank_) + "\n" + std::to_string(about) + "\n" + what);
      } catch (const Error&) {
        // The store is gone too: the error below says what matters.
      }
    }
    if (code == ErrorCode::kTimeout) timed_out(what);
    throw Error(code, what);
  }

  [[noreturn]] void timed_out(const std::string& what) {
    throw Error(ErrorCode::kTimeout,
                "timed out after " + std::to_string(timeout_.count()) + " ms: " + what);
  }

  // Takes this rank's claim back, so its record cannot be mistaken for a live one.
  void give_back() {
    if (!claimed_) return;
    claimed_ = false;
    if (store_.failed()) return;  // unreachable: nothing to give back to
    try {
      store_.compare_set(rank_key(scope_of(base_, incarnation_), rank_), me_, "");
    } catch (const Error&) {
      // Best effort: the record names a process that is gone or a nonce no one else has.
    }
  }

  WatchedStore store_;
  const std::string base_;
  const int world_size_;
  const int rank_;
  const JoinRecord& mine_;
  const std::string me_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point deadline_;
  int64_t incarnation_ = 0;
  bool claimed_ = false;
};

}  // namespace

Membership meet(Store& store, const std::string& base, int world_size, int rank,
                const JoinRecord& mine, std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(live_joins().mutex);
    live_joins().nonces.insert(mine.nonce);
  }
  try {
    return Meeting(store, base, world_size, rank, mine, timeout).run();
  } catch (...) {
    forget_join(mine);
    throw;
  }
}

std::string settled_key(const std::string& scope, int rank) {
  return scope + "/ready/done/" + std::to_string(rank);
}

namespace {
std::string failed_key(const std::string& scope) {
  return scope + "/ready/failed";
}
}  // namespace

std::optional<Error> backend_failed(Store& store, const std::string& scope) {
  const std::string key = failed_key(scope);
  if (!store.check({key})) return std::nullopt;
  return Error(ErrorCode::kRemoteError, "failed on " + store.get(key));
}

void settle_backends(Store& store, const std::string& scope, int world_size, int rank,
                     const std::string& failure, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds linger) {
  if (world_size <= 1) return;
  auto up_key = [&](int r) { return scope + "/ready/" + std::to_string(r); };
  // Publishes this rank's failure (the first one stays: the others report the rank that failed
  // first), then gives the others up to `linger` to read it.
  auto publish = [&](const std::string& why) {
    store.compare_set(failed_key(scope), "", "rank " + std::to_string(rank) + ": " + why);
    if (linger.count() <= 0) return;
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) {
      if (r != rank) keys.push_back(settled_key(scope, r));
    }
    try {
      store.wait(keys, linger);
    } catch (const Error&) {
      // A rank still making its backend reads it later, or never: the linger is best effort.
    }
  };
  auto fail_if_one_failed = [&] {
    if (auto failed = backend_failed(store, scope)) throw *failed;
  };
  if (!failure.empty()) {
    publish(failure);
    return;
  }
  // A count, and a key the last rank up writes: a few store calls per rank and nap, whatever
  // the world size (the per-rank keys are read only to name the missing ranks at a timeout).
  const std::string all_key = scope + "/ready/all";
  store.set(up_key(rank), "1");
  if (store.add(scope + "/ready/count", 1) == world_size) store.set(all_key, "1");
  const auto deadline = deadline_after(timeout);
  Backoff backoff;
  while (!store.check({all_key})) {
    fail_if_one_failed();
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int m = 0; m < world_size; ++m) {
        if (!store.check({up_key(m)})) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
      }
      const std::string why = "timed out after " + std::to_string(timeout.count()) +
                              " ms waiting for the other ranks' backends: rank(s) " + missing +
                              " not up";
      // A late rank must not take the group for formed once this one has given up on it.
      publish(why);
      throw Error(ErrorCode::kTimeout, why);
    }
    nap_on(store, all_key, backoff.next(deadline));
  }
  // Every rank was up, unless one gave up in the meantime (its timeout, as this rank arrived).
  fail_if_one_failed();
}

void leave(Store& store, const std::string& scope, int rank, const JoinRecord& mine) {
  forget_join(mine);
  JoinRecord gone = mine;
  gone.left = true;
  store.compare_set(rank_key(scope, rank), mine.encode(), gone.encode());
}

std::string ledger_of(const std::string& scope) {
  return scope + "/keys";
}

size_t purge_incarnations(Store& store, const std::string& base, int64_t below, int world_size) {
  const std::string marker = base + "/purged";
  const int64_t done = store.check({marker}) ? std::atoll(store.get(marker).c_str()) : 0;
  size_t deleted = 0;
  for (int64_t i = done + 1; i < below; ++i) {
    const std::string scope = scope_of(base, i);
    deleted += purge_ledger(store, ledger_of(scope));
    int ranks = world_size;
    if (const auto st = read_state(store, scope); st && st->formed) {
      ranks = std::max(ranks, st->world_size);
    }
    for (int r = 0; r < ranks; ++r) {
      deleted += store.delete_key(rank_key(scope, r)) ? 1 : 0;
      deleted += store.delete_key(scope + "/left/" + std::to_string(r)) ? 1 : 0;
    }
    deleted += store.delete_key(scope + "/state") ? 1 : 0;
  }
  if (below - 1 > done) store.set(marker, std::to_string(below - 1));
  return deleted;
}

void forget_join(const JoinRecord& mine) {
  std::lock_guard<std::mutex> lock(live_joins().mutex);
  live_joins().nonces.erase(mine.nonce);
}

}  // namespace tutti::detail
