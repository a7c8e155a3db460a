// CollectiveGroup's life: create (rendezvous, "auto", the backend), split, abort, destroy.
// The ops themselves are in group_ops.cc, their checks in validation.cc.
#include "tutti/collective_group.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "group/admission.h"
#include "group/backend_registry.h"
#include "group/group_state.h"
#include "group/group_util.h"
#include "group/op_check.h"
#include "group/rendezvous.h"
#include "store/ledger_store.h"
#include "store/stoppable_store.h"
#include "tutti/embedding.h"
#include "tutti/env.h"
#include "tutti/error.h"
#include "tutti/prefix_store.h"
#include "tutti/store.h"
#include "tutti/tcp_store.h"
#include "util/deadline.h"
#include "util/host_identity.h"
#include "util/local_processes.h"
#include "util/logging.h"
#include "util/op_clock.h"

namespace tutti {
namespace {

using Clock = std::chrono::steady_clock;

std::string where(const std::string& name, int rank, int world_size) {
  return "group '" + name + "' (rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
         ")";
}

// How long a rank hosting the group's TCP store keeps serving, after destroy, for the others.
constexpr std::chrono::milliseconds kHostLingerTimeout{10000};

// The TCP stores that ranks of destroyed groups host, kept serving until the group's other ranks
// have left (or kHostLingerTimeout), so that destroy() returns at once while slower ranks still
// find the store for their own teardown. One thread for the process looks at them every 20 ms
// (started at the first, idle after); the process's exit waits for them (wait()), no longer than
// their linger.
class LingeringStores {
 public:
  // The calling process's: a forked child gets one of its own (its parent's thread is not in it,
  // and the parent's lock may have been held at the fork).
  static LingeringStores& get() {
    static std::mutex made;
    static LingeringStores* instance = nullptr;
    std::lock_guard<std::mutex> lock(made);
    if (instance == nullptr || instance->pid_ != ::getpid()) {
      instance = new LingeringStores();  // leaked: its thread outlives the statics
    }
    return *instance;
  }

  // Until every key in `keys` (the ranks' departures) is set, or `mine` (this rank's own, set
  // before) is gone: a later incarnation formed and its rank 0 deleted this one's keys; at most
  // `linger`. With no keys: for `linger`.
  void add(std::shared_ptr<Store> store, std::vector<std::string> keys, std::string mine,
           std::chrono::milliseconds linger = kHostLingerTimeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (exiting_) {
      // A group destroyed by the exit hooks, or after them: no new thread now; wait here.
      lock.unlock();
      try {
        if (keys.empty()) {
          std::this_thread::sleep_for(linger);
        } else {
          store->wait(keys, linger);
        }
      } catch (const Error& e) {
        TUTTI_LOG_DEBUG("a destroyed group's store host: {}", e.what());
      }
      return;
    }
    if (!started_) {
      std::atexit([] { get().wait(/*exiting=*/true); });  // a child's exit: its own (empty) one
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    entries_.push_back({std::move(store), std::move(keys), std::move(mine), Clock::now() + linger});
    wake_.notify_all();
  }

  void wait(bool exiting = false) {
    std::unique_lock<std::mutex> lock(mutex_);
    exiting_ = exiting_ || exiting;
    done_.wait_for(lock, kHostLingerTimeout + std::chrono::seconds(5),
                   [&] { return entries_.empty() && !looking_; });
  }

 private:
  struct Entry {
    std::shared_ptr<Store> store;
    std::vector<std::string> keys;
    std::string mine;
    Clock::time_point deadline;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return !entries_.empty(); });
      std::vector<Entry> entries;
      entries.swap(entries_);
      looking_ = true;
      lock.unlock();
      std::vector<Entry> still;
      for (auto& e : entries) {
        bool over = Clock::now() >= e.deadline;
        if (!over) {
          try {
            // Every other rank has left, or a later incarnation took over.
            over = !e.keys.empty() && (e.store->check(e.keys) || !e.store->check({e.mine}));
          } catch (const Error& err) {
            TUTTI_LOG_DEBUG("a destroyed group's store host: {}", err.what());
            over = true;
          }
        }
        if (!over) still.push_back(std::move(e));
      }
      entries.clear();  // the servers of the finished ones stop here, unless a group uses them
      if (!still.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      lock.lock();
      for (auto& e : still) entries_.push_back(std::move(e));
      looking_ = false;
      if (entries_.empty()) done_.notify_all();
    }
  }

  const pid_t pid_ = ::getpid();
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<Entry> entries_;
  bool looking_ = false;
  bool started_ = false;
  bool exiting_ = false;  // the process's exit began
};

// How long a failing rank that hosts the store waits for the others to read why (those in the
// round after the backends poll at least every 200 ms; a rank still making its backend does not
// read it before that backend's own timeout, and is not waited for).
constexpr std::chrono::milliseconds kFailureLinger{2000};

// Runs fn, prefixing the message of any tutti::Error it throws with `context`.
template <typename Fn>
auto prefixed(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(e.code(), context + ": " + e.what());
  }
}

// A split's or shrink's timeout: `asked`, or `fallback` for kUseGroupTimeout; positive.
std::chrono::milliseconds subgroup_timeout(const std::string& ctx, std::chrono::milliseconds asked,
                                           std::chrono::milliseconds fallback) {
  const auto timeout = asked == kUseGroupTimeout ? fallback : asked;
  if (timeout.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx + ": timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  }
  return timeout;
}

// A split's or shrink's backend: `asked`, or the parent's when empty, as a registry key; `info`
// found unless it is "auto" (chosen once the members met).
std::string subgroup_backend(const std::string& ctx, const std::string& asked,
                             const std::string& parents, BackendInfo* info) {
  const std::string requested = detail::backend_key(asked.empty() ? parents : asked);
  if (requested != "auto") *info = prefixed(ctx, [&] { return detail::find_backend(requested); });
  return requested;
}

// The backend a subgroup or grown group takes once its members met: "auto"'s choice for their
// hosts when asked for "auto", or when the backend was inherited and does not suit them (hier for
// ranks on one host, a one-host backend such as shm across hosts); else `info`. Every member
// computes the same.
BackendInfo settled_backend(const std::string& ctx, const std::string& requested,
                            const BackendInfo& info, bool inherited,
                            const std::vector<std::string>& hosts) {
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts.front(); });
  const bool unsuited = (info.suits && !info.suits(hosts)) ||
                        (info.scope == BackendInfo::Scope::kOneHost && !one_host);
  if (requested == "auto" || (inherited && unsuited)) {
    return prefixed(ctx + ": backend 'auto'", [&] { return detail::choose_auto_backend(hosts); });
  }
  return info;
}

bool aborts_group(ErrorCode code) {
  return code == ErrorCode::kTimeout || code == ErrorCode::kIoError ||
         code == ErrorCode::kRemoteError || code == ErrorCode::kInternal ||
         code == ErrorCode::kAborted;
}

// `under`: the store the backend's keys go into (default: the group's ledger).
BackendContext backend_context(const CollectiveGroup::State& s,
                               std::shared_ptr<Store> under = nullptr) {
  BackendContext bctx;
  bctx.group_name = *s.name;
  bctx.rank = s.rank;
  bctx.world_size = s.world_size;
  if (!under) under = s.ledger ? s.ledger : s.store;
  bctx.store = std::make_shared<PrefixStore>(s.scope + "/backend", std::move(under));
  bctx.store->set_timeout(s.timeout);
  bctx.timeout = s.timeout;
  bctx.instance = s.instance;
  bctx.hosts = s.hosts;
  bctx.pids = s.pids;
  bctx.global_ranks = s.global_ranks;
  return bctx;
}

// Makes the backend (from the parent's split() when it offers one, else the factory) and
// reads what it supports.
void attach_backend(CollectiveGroup::State& s, const BackendInfo& info, BackendContext bctx,
                    const std::string& context, Store* round = nullptr) {
  Store& round_store = round != nullptr ? *round : *s.ledger;
  std::unique_ptr<Backend> backend;
  const std::string label = context + ": backend '" + info.name + "'";
  // The rank that hosts the store stops it when it fails: it first gives the others a moment to
  // read why.
  auto* tcp = dynamic_cast<TCPStore*>(s.store.get());
  const auto linger = s.owns_store && tcp != nullptr && tcp->is_hosting()
                          ? std::min(s.timeout, kFailureLinger)
                          : std::chrono::milliseconds(0);
  // Tells the other ranks this rank's backend failed (best effort: the store may be the cause).
  auto tell_failed = [&](const std::string& why) {
    try {
      detail::settle_backends(round_store, s.scope, s.world_size, s.rank, why, s.timeout, linger);
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: telling the other ranks: {}", label, e.what());
    }
  };
  // The backend's waits in the store end as soon as another rank's backend failed (the round
  // after this one would fail anyway), or a rank's process on this host exited, instead of at
  // their timeout. The exits are looked at first and said last: a rank whose backend failed
  // says why in the store before it exits, and its reason is the better message.
  const auto peers = std::make_shared<const detail::PeerProcesses>(s.pids, s.starts, s.rank);
  const char* const exited_while = " exited while the group's backend was being made";
  auto watched = std::make_shared<detail::StoppableStore>(
      bctx.store, [&round_store, &s, peers, exited_while]() -> detail::StoppableStore::Stop {
        const std::string gone = peers->exited();
        if (const auto failed = detail::backend_failed(round_store, s.scope)) {
          return {failed->code(), failed->what()};
        }
        if (gone.empty()) return {};
        return {ErrorCode::kIoError, gone + exited_while};
      });
  watched->set_timeout(bctx.store->timeout());
  bctx.store = watched;
  struct Disarm {
    detail::StoppableStore& store;
    ~Disarm() { store.disarm(); }  // the backend keeps its store; the check is for its making
  } disarm{*watched};
  try {
    if (bctx.parent != nullptr) {
      backend = bctx.from_shrink ? bctx.parent->shrink(bctx) : bctx.parent->split(bctx);
    }
    if (!backend) backend = info.factory(bctx);
    if (!backend) throw Error(ErrorCode::kInternal, "the factory returned null");
  } catch (const Error& e) {
    // A failure of this rank's own that follows a rank's death (the shm segment removed, a
    // connection closed) names the death first: it is the cause. Not one that already names
    // another rank's failure (kRemoteError) or an abort.
    const std::string gone = peers->exited();
    std::string why = e.what();
    ErrorCode code = e.code();
    if (!gone.empty() && code != ErrorCode::kRemoteError && code != ErrorCode::kAborted &&
        why.find(exited_while) == std::string::npos) {
      why = gone + exited_while + " (then this rank: " + why + ")";
      code = ErrorCode::kIoError;
    }
    tell_failed(why);
    throw Error(code, label + ": " + why);
  } catch (const std::exception& e) {
    tell_failed(e.what());
    throw Error(ErrorCode::kInternal, label + ": " + e.what());
  }
  // Every rank's backend is up before any rank returns (and may destroy it again).
  prefixed(label, [&] {
    detail::settle_backends(round_store, s.scope, s.world_size, s.rank, "", s.timeout, linger);
  });
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    s.device_supported[static_cast<size_t>(type)] = backend->supports_device(type);
  }
  for (size_t op = 0; op < kOpTypeCount; ++op) {
    s.op_supported[op] = backend->supports(static_cast<OpType>(op));
  }
  s.max_devices = std::max(1, backend->max_devices_per_op());
  s.runs_inline = backend->runs_inline();
  s.backend = std::move(backend);
}

}  // namespace

CollectiveGroup::CollectiveGroup(std::shared_ptr<State> state) : state_(std::move(state)) {}

CollectiveGroup::~CollectiveGroup() {
  destroy();
}

const std::string& CollectiveGroup::name() const {
  return *state_->name;
}
const std::string& CollectiveGroup::instance() const {
  return state_->instance;
}
int CollectiveGroup::rank() const {
  return state_->rank;
}
int CollectiveGroup::world_size() const {
  return state_->world_size;
}
const std::string& CollectiveGroup::backend_name() const {
  return state_->backend_name;
}
std::chrono::milliseconds CollectiveGroup::timeout() const {
  return state_->timeout;
}
int CollectiveGroup::global_rank() const {
  return state_->global_ranks[state_->rank];
}
const std::vector<int>& CollectiveGroup::global_ranks() const {
  return state_->global_ranks;
}
bool CollectiveGroup::is_destroyed() const {
  return state_->destroyed.load();
}
std::string CollectiveGroup::describe() const {
  return state_->describe();
}

bool CollectiveGroup::is_aborted() const {
  return state_->aborted.load();
}

void CollectiveGroup::issue_from_this_thread() {
  state_->take_thread();
}

std::shared_ptr<CollectiveGroup> CollectiveGroup::create(int world_size, int rank,
                                                         std::string_view backend,
                                                         std::string_view group_name,
                                                         const GroupOptions& options) {
  const std::string name(group_name);
  const std::string ctx = "init on " + where(name, rank, world_size);
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "init: group name must not be empty");
  }
  if (world_size <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx + ": world size must be positive, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": rank " + std::to_string(rank) +
                                                 " is outside [0, " + std::to_string(world_size) +
                                                 ")");
  }
  if (options.timeout.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": timeout must be positive, got " +
                                                 std::to_string(options.timeout.count()) + " ms");
  }
  // Before the rendezvous: by the time any rank's backend counts the processes that compete for
  // its CPUs, every rank of the group has registered (local_processes.h).
  if (world_size > 1) detail::register_local_process();
  const auto start = Clock::now();
  const std::string requested = detail::backend_key(backend);
  const bool automatic = requested == "auto";
  BackendInfo info;
  if (!automatic) info = prefixed(ctx, [&] { return detail::find_backend(requested); });

  // A rank other than 0 that cannot reach a TCP store rank 0 hosts, or whose connection to it
  // closed under a request (the host died while this rank waited): say who hosts it.
  const auto unreachable_host = [&](const Error& e, const std::string& where) {
    const std::string what = e.what();
    const bool lost =
        what.find("could not connect") != std::string::npos ||
        what.find("could not be reached") != std::string::npos ||
        (e.code() == ErrorCode::kIoError && (what.find("End of file") != std::string::npos ||
                                             what.find("reset by peer") != std::string::npos ||
                                             what.find("Broken pipe") != std::string::npos));
    if (rank == 0 || !lost) return;
    throw Error(e.code(), what + "; rank 0 hosts this group's store (" + where +
                              "): it has not started, or it is gone (did its init fail?)");
  };
  const detail::StoreChoice choice = prefixed(ctx, [&] {
    try {
      return detail::resolve_store(options, world_size, rank);
    } catch (const Error& e) {
      if (!options.store && options.store_url.rfind("tcp://", 0) == 0) {
        unreachable_host(e, options.store_url);
      }
      throw;
    }
  });
  const detail::JoinRecord mine = detail::JoinRecord::mine(world_size, requested);
  const detail::Membership m = prefixed(ctx, [&] {
    auto* tcp = dynamic_cast<TCPStore*>(choice.store.get());
    try {
      return detail::meet(*choice.store, detail::group_base(choice.job_id, name), world_size, rank,
                          mine, options.timeout);
    } catch (const Error& e) {
      if (tcp != nullptr && tcp->is_hosting() && world_size > 1) {
        // The others read why from the store (the failed incarnation names this rank and its
        // reason): it keeps serving them a while after this rank's init fails.
        LingeringStores::get().add(choice.store, {}, "", kFailureLinger);
      }
      if (tcp != nullptr && !tcp->is_hosting() && choice.owned) {
        unreachable_host(e, "tcp://" + tcp->host() + ":" + std::to_string(tcp->port()));
      }
      throw;
    }
  });
  if (automatic) {
    info =
        prefixed(ctx + ": backend 'auto'", [&] { return detail::choose_auto_backend(m.hosts()); });
  }

  auto s = std::make_shared<State>();
  s->name = std::make_shared<const std::string>(name);
  s->rank = rank;
  s->world_size = world_size;
  s->creator_pid = static_cast<long>(::getpid());
  s->backend_name = info.name;
  s->timeout = options.timeout;
  s->global_ranks.resize(world_size);
  std::iota(s->global_ranks.begin(), s->global_ranks.end(), 0);
  s->hosts = m.hosts();
  s->pids = m.pids();
  for (const auto& r : m.ranks) s->starts.push_back(r.start_seen_from(s->hosts[s->rank]));
  s->store = choice.store;
  s->owns_store = choice.owned;
  s->caller_store = !choice.owned;
  s->scope = m.scope;
  s->root_scope = m.scope;
  s->ledger = std::make_shared<detail::LedgerStore>(choice.store, detail::ledger_of(m.scope));
  s->base = detail::group_base(choice.job_id, name);
  s->admit_key = s->base + "/admit";
  s->ledger_prefix = detail::ledger_of(m.scope);
  s->incarnation = m.incarnation;
  s->join_record = mine.encode();
  s->check_ops = options.check_ops || detail::check_ops_from_env();
  s->take_thread();
  s->instance = detail::escape_name(choice.job_id.empty() ? "nojob" : choice.job_id) + "." +
                detail::escape_name(name) + "." + std::to_string(m.incarnation);
  s->recorder = detail::FlightRecorder::create({name, s->instance, rank, world_size, info.name});
  detail::op_now();  // the ops' clock measures its rate here (once a process), not in an op
  if (auto* tcp = dynamic_cast<TCPStore*>(s->store.get()); tcp != nullptr && s->owns_store) {
    // The host learns of this rank's departure even if the process dies (see leave_store).
    try {
      tcp->set_on_close(s->scope + "/left/" + std::to_string(rank), "closed");
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: no departure notice: {}", s->describe(), e.what());
    }
  }
  try {
    attach_backend(*s, info, backend_context(*s), ctx);
  } catch (const Error&) {
    // This process no longer holds the rank: its record says so and its join is forgotten, and
    // then it says it is done with the store, which a failing rank that hosts it waits for
    // (best effort: the store may be what failed).
    try {
      detail::leave(*choice.store, m.scope, rank, mine);
      s->ledger->set(detail::settled_key(m.scope, rank), "1");
    } catch (const Error&) {
      detail::forget_join(mine);
    }
    throw;
  }
  TUTTI_LOG_INFO("joined {} with backend '{}' (incarnation {}) in {:.1f} ms", s->describe(),
                 info.name, m.incarnation,
                 std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return std::shared_ptr<CollectiveGroup>(new CollectiveGroup(std::move(s)));
}

std::shared_ptr<CollectiveGroup> CollectiveGroup::split(const std::vector<int>& ranks,
                                                        const SplitOptions& options) {
  State& s = *state_;
  const std::string ctx = "split of " + s.describe();
  if (s.forked()) throw Error(ErrorCode::kInvalidUsage, ctx + ": " + s.forked_message());
  if (s.destroyed.load()) throw Error(ErrorCode::kInvalidUsage, ctx + ": the group was destroyed");
  if (ranks.empty()) throw Error(ErrorCode::kInvalidArgument, ctx + ": the list of ranks is empty");
  std::vector<bool> seen(s.world_size, false);
  for (int r : ranks) {
    if (r < 0 || r >= s.world_size) {
      throw Error(ErrorCode::kInvalidArgument, ctx + ": rank " + std::to_string(r) +
                                                   " is outside [0, " +
                                                   std::to_string(s.world_size) + ")");
    }
    if (seen[r]) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": rank " + std::to_string(r) + " is listed twice");
    }
    seen[r] = true;
  }
  const std::chrono::milliseconds timeout = subgroup_timeout(ctx, options.timeout, s.timeout);
  BackendInfo info;
  const std::string requested = subgroup_backend(ctx, options.backend, s.backend_name, &info);

  std::string listed;
  for (int r : ranks) listed += (listed.empty() ? "" : ",") + std::to_string(r);
  const auto me = std::find(ranks.begin(), ranks.end(), s.rank);
  if (options.local) {
    if (options.name.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": a local split needs a name (it is what its members meet under)");
    }
    if (me == ranks.end()) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": a local split is called by its members only, and rank " +
                      std::to_string(s.rank) + " is not among ranks " + listed);
    }
    std::lock_guard<std::mutex> guard(s.state_mutex);
    if (!s.local_splits.insert(options.name).second) {
      throw Error(ErrorCode::kInvalidUsage,
                  ctx + ": the local split '" + options.name + "' was made before on this group");
    }
  }
  // Splits are collective and ordered like ops: the n-th split meets under split/<n>. Ops
  // queued before it finish first, and none runs while the backend is asked to split. A local
  // split meets under its name instead, whenever its members call it.
  std::unique_lock<std::mutex> lock(s.op_mutex, std::defer_lock);
  if (!options.local) {
    s.drain();
    lock.lock();
  }
  s.throw_if_aborted(ctx);
  const uint64_t n = options.local ? 0 : s.split_count++;
  if (me == ranks.end()) return nullptr;
  const int sub_rank = static_cast<int>(me - ranks.begin());
  const int sub_world = static_cast<int>(ranks.size());
  const std::string name =
      options.name.empty() ? *s.name + ".split" + std::to_string(n) : options.name;
  const std::string sub_ctx = ctx + " into " + where(name, sub_rank, sub_world);
  const std::string base = options.local ? s.scope + "/local/" + detail::escape_name(name)
                                         : s.scope + "/split/" + std::to_string(n);
  // A local split's name is length-prefixed: "x.s0" must not name what "x"'s first split does.
  const std::string escaped = detail::escape_name(name);
  const std::string instance =
      options.local ? s.instance + ".l" + std::to_string(escaped.size()) + "-" + escaped
                    : s.instance + ".s" + std::to_string(n);
  // A local split's other members are not in the parent backend's call: it meets afresh.
  return form_subgroup(ranks, name, base, instance, requested, info, options.backend.empty(),
                       /*with_parent=*/!options.local, timeout, sub_ctx, /*after_failure=*/false);
}

std::shared_ptr<CollectiveGroup> CollectiveGroup::shrink(const ShrinkOptions& options) {
  State& s = *state_;
  const std::string ctx = "shrink of " + s.describe();
  if (s.forked()) throw Error(ErrorCode::kInvalidUsage, ctx + ": " + s.forked_message());
  if (s.destroyed.load()) throw Error(ErrorCode::kInvalidUsage, ctx + ": the group was destroyed");
  std::vector<bool> gone(s.world_size, false);
  for (int r : options.exclude) {
    if (r < 0 || r >= s.world_size) {
      throw Error(ErrorCode::kInvalidArgument, ctx + ": excluded rank " + std::to_string(r) +
                                                   " is outside [0, " +
                                                   std::to_string(s.world_size) + ")");
    }
    if (r == s.rank) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": rank " + std::to_string(r) +
                      " excludes itself (a rank that leaves does not call shrink)");
    }
    if (gone[r]) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": excluded rank " + std::to_string(r) + " is listed twice");
    }
    gone[r] = true;
  }
  // Twice the group's timeout by default: a survivor whose op ends only at that timeout (its
  // peer stopped, not dead) comes to shrink that much later than one that saw the death at once.
  // (Saturating: twice an infinite timeout, milliseconds::max(), is still infinite.)
  const std::chrono::milliseconds twice = s.timeout >= std::chrono::milliseconds::max() / 2
                                              ? std::chrono::milliseconds::max()
                                              : 2 * s.timeout;
  const std::chrono::milliseconds timeout = subgroup_timeout(ctx, options.timeout, twice);
  BackendInfo info;
  const std::string requested = subgroup_backend(ctx, options.backend, s.backend_name, &info);
  // A live group's ops end first (they would wait on the dead rank): shrink aborts it. Then it
  // holds the op lock, as split does: a destroy from another thread waits for it (it sees the
  // group destroyed within 50 ms, and the subgroup's meeting stops at once), so the store is
  // not taken from under it.
  if (!s.aborted.load()) s.abort(ctx + ": the group is being shrunk");
  std::lock_guard<std::mutex> op_lock(s.op_mutex);
  if (s.destroyed.load()) throw Error(ErrorCode::kInvalidUsage, ctx + ": the group was destroyed");
  const uint64_t n = s.shrink_count++;

  // The survivors agree on the members through the store: each says it is here, then waits until
  // every other rank is either here or known gone (or the timeout), and proposes who is here;
  // the first proposal stored is everyone's.
  const std::string base = s.scope + "/shrink/" + std::to_string(n);
  const std::string members_key = base + "/members";
  const auto here_key = [&](int r) { return base + "/here/" + std::to_string(r); };
  const std::string my_host = detail::host_identity();
  const long my_pid = static_cast<long>(::getpid());
  // Gone without a doubt: its process on this host has exited (a pid and start time name one
  // process), or its connection to the TCP store's host closed: the host then sets its root
  // group's departure key to "closed" (a rank that destroyed that group but lives on wrote "1").
  const auto known_gone = [&](int r) {
    if (s.hosts[r] == my_host && s.pids[r] != my_pid && s.starts[r] != 0 &&
        detail::process_start_time(s.pids[r]) != s.starts[r]) {
      return true;
    }
    const std::string left = s.root_scope + "/left/" + std::to_string(s.global_ranks[r]);
    return s.store->check({left}) && s.store->get(left) == "closed";
  };
  std::vector<bool> here(s.world_size, false);
  here[s.rank] = true;
  std::string decided;
  prefixed(ctx, [&] {
    s.ledger->set(here_key(s.rank), "1");
    const auto deadline = detail::deadline_after(timeout);
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      if (s.ledger->check({members_key})) {  // the members were decided
        decided = s.ledger->get(members_key);
        return;
      }
      bool waiting = false;
      for (int r = 0; r < s.world_size; ++r) {
        if (here[r] || gone[r]) continue;
        if (s.ledger->check({here_key(r)})) {
          here[r] = true;
        } else if (known_gone(r)) {
          gone[r] = true;
        } else {
          waiting = true;
        }
      }
      if (!waiting || Clock::now() >= deadline || s.destroyed.load()) return;
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  });
  if (s.destroyed.load()) {
    throw Error(ErrorCode::kAborted, ctx + ": the group was destroyed during the shrink");
  }
  if (decided.empty()) {
    std::string proposal;
    for (int r = 0; r < s.world_size; ++r) {
      if (here[r]) proposal += (proposal.empty() ? "" : ",") + std::to_string(r);
    }
    decided = prefixed(ctx, [&] {
      try {
        return s.ledger->compare_set(members_key, "", proposal);
      } catch (const Error&) {
        // The connection may have broken after the proposal was applied: what is stored wins.
        if (s.ledger->check({members_key})) return s.ledger->get(members_key);
        throw;
      }
    });
  }
  std::vector<int> ranks;
  for (size_t at = 0; at <= decided.size();) {
    size_t comma = decided.find(',', at);
    if (comma == std::string::npos) comma = decided.size();
    const std::string item = decided.substr(at, comma - at);
    char* end = nullptr;
    const long r = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || r < 0 || r >= s.world_size ||
        std::find(ranks.begin(), ranks.end(), static_cast<int>(r)) != ranks.end()) {
      throw Error(ErrorCode::kInternal, ctx + ": the store's member list '" + decided + "' (" +
                                            members_key + ") is not a list of this group's ranks");
    }
    ranks.push_back(static_cast<int>(r));
    at = comma + 1;
  }
  if (std::find(ranks.begin(), ranks.end(), s.rank) == ranks.end()) {
    throw Error(ErrorCode::kAborted, ctx + ": the survivors formed their group of ranks " +
                                         decided + " without rank " + std::to_string(s.rank) +
                                         " (it was not among those there when they decided)");
  }
  std::string left_out;
  for (int r = 0; r < s.world_size; ++r) {
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) {
      left_out += (left_out.empty() ? "" : ",") + std::to_string(r);
    }
  }
  const std::string name =
      options.name.empty() ? *s.name + ".shrink" + std::to_string(n) : options.name;
  const int sub_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), s.rank) - ranks.begin());
  const std::string sub_ctx =
      ctx + " into " + where(name, sub_rank, static_cast<int>(ranks.size()));
  TUTTI_LOG_INFO("{}: ranks {} go on without {}", ctx, decided, left_out);
  return form_subgroup(ranks, name, base + "/group", s.instance + ".k" + std::to_string(n),
                       requested, info, options.backend.empty(), /*with_parent=*/true, timeout,
                       sub_ctx, /*after_failure=*/true);
}

std::shared_ptr<CollectiveGroup> CollectiveGroup::form_subgroup(
    const std::vector<int>& ranks, const std::string& name, const std::string& base,
    const std::string& instance, const std::string& requested, const BackendInfo& asked,
    bool inherited, bool with_parent, std::chrono::milliseconds timeout, const std::string& sub_ctx,
    bool after_failure) {
  State& s = *state_;
  BackendInfo info = asked;
  std::string listed;
  for (int r : ranks) listed += (listed.empty() ? "" : ",") + std::to_string(r);
  const int sub_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), s.rank) - ranks.begin());
  const int sub_world = static_cast<int>(ranks.size());

  // The members meet through the parent's store (no new server), checking that they agree on
  // the list of ranks. The parent's abort or destroy from another thread ends the split's waits
  // (the meeting, the backend's rendezvous, the round after it) within StoppableStore::kSlice;
  // a shrink, made after the parent failed, is ended by its destroy only.
  // The parent's stores, taken as a destroy from another thread would leave them (a local split
  // runs outside the op lock; a split or shrink whose destroy ran whole before it took the op
  // lock is refused here): the split holds its own references from here on.
  std::shared_ptr<Store> store, ledger;
  {
    std::lock_guard<std::mutex> guard(s.state_mutex);
    if (s.destroyed.load() || !s.ledger) {
      throw Error(ErrorCode::kInvalidUsage, sub_ctx + ": the group was destroyed");
    }
    store = s.store;
    ledger = s.ledger;
  }
  std::weak_ptr<State> parent = state_;
  using Stop = detail::StoppableStore::Stop;
  auto stoppable =
      std::make_shared<detail::StoppableStore>(ledger, [parent, after_failure]() -> Stop {
        auto p = parent.lock();
        if (!p) return {ErrorCode::kAborted, "the parent group is gone"};
        if (p->aborted.load() && !after_failure) {
          std::lock_guard<std::mutex> guard(p->state_mutex);
          return {ErrorCode::kAborted, "the parent group was aborted (" + p->abort_reason + ")"};
        }
        if (p->destroyed.load()) return {ErrorCode::kAborted, "the parent group was destroyed"};
        return {};
      });
  const detail::JoinRecord mine =
      detail::JoinRecord::mine(sub_world, requested + " ranks " + listed);
  const detail::Membership m = prefixed(
      sub_ctx, [&] { return detail::meet(*stoppable, base, sub_world, sub_rank, mine, timeout); });
  info = settled_backend(sub_ctx, requested, info, inherited, m.hosts());

  auto sub = std::make_shared<State>();
  sub->name = std::make_shared<const std::string>(name);
  sub->rank = sub_rank;
  sub->world_size = sub_world;
  sub->creator_pid = static_cast<long>(::getpid());
  sub->backend_name = info.name;
  sub->timeout = timeout;
  for (int r : ranks) {
    sub->global_ranks.push_back(s.global_ranks[r]);
    sub->hosts.push_back(s.hosts[r]);
    sub->pids.push_back(s.pids[r]);
    sub->starts.push_back(s.starts[r]);
  }
  sub->store = store;
  sub->ledger = ledger;  // its keys go with the root group's incarnation
  sub->admit_key = s.admit_key;
  sub->ledger_prefix = s.ledger_prefix;
  // A split uses the parent's store: the parent leaves it. A shrink's parent failed (it leaves
  // without waiting for anyone), so the survivors' group takes the leaving over: its ranks note
  // their departures, and the store's host keeps serving until they have left.
  sub->owns_store = after_failure && s.owns_store;
  sub->caller_store = after_failure && s.caller_store;
  sub->scope = m.scope;
  sub->root_scope = s.root_scope;
  sub->join_record = mine.encode();
  sub->check_ops = s.check_ops;
  sub->take_thread();
  sub->instance = instance;
  sub->recorder =
      detail::FlightRecorder::create({name, sub->instance, sub_rank, sub_world, info.name});
  detail::op_now();  // (as in create)
  if (auto* tcp = dynamic_cast<TCPStore*>(sub->store.get()); tcp != nullptr && sub->owns_store) {
    try {
      tcp->set_on_close(sub->scope + "/left/" + std::to_string(sub_rank), "closed");
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: no departure notice: {}", sub->describe(), e.what());
    }
  }
  BackendContext bctx = backend_context(*sub, stoppable);
  if (with_parent && info.name == s.backend_name) {
    bctx.parent = s.backend.get();
    // A shrink's survivors may derive their backend from the failed group's (Backend::shrink).
    bctx.from_shrink = after_failure;
    for (int r = 0; r < s.world_size && after_failure; ++r) {
      if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) bctx.shrunk_without.push_back(r);
    }
  }
  attach_backend(*sub, info, std::move(bctx), sub_ctx, stoppable.get());
  stoppable->disarm();  // the subgroup's backend keeps its store: the parent's end is not its
  TUTTI_LOG_INFO("{} {} off {} with backend '{}'", after_failure ? "shrank" : "split",
                 sub->describe(), s.describe(), info.name);
  return std::shared_ptr<CollectiveGroup>(new CollectiveGroup(std::move(sub)));
}

namespace {

// The grown group, on a member or a new rank alike, once its ranks met: a root group of its own
// (its ranks' departures are noted under its scope) whose keys are noted in the members' ledger.
std::shared_ptr<CollectiveGroup::State> grown_state(
    const detail::Admission& a, const detail::Membership& m, int rank, const BackendInfo& info,
    std::shared_ptr<Store> store, std::shared_ptr<Store> ledger, bool owns_store, bool caller_store,
    const detail::JoinRecord& mine, const std::string& admit_key) {
  const int world = a.world + a.add;
  auto g = std::make_shared<CollectiveGroup::State>();
  g->name = std::make_shared<const std::string>(a.name);
  g->rank = rank;
  g->world_size = world;
  g->creator_pid = static_cast<long>(::getpid());
  g->backend_name = info.name;
  g->timeout = std::chrono::milliseconds(a.timeout_ms);
  g->global_ranks.resize(world);
  std::iota(g->global_ranks.begin(), g->global_ranks.end(), 0);
  g->hosts = m.hosts();
  g->pids = m.pids();
  for (const auto& r : m.ranks) g->starts.push_back(r.start_seen_from(g->hosts[g->rank]));
  g->store = std::move(store);
  g->ledger = std::move(ledger);
  g->owns_store = owns_store;
  g->caller_store = caller_store;
  g->scope = m.scope;
  g->root_scope = m.scope;
  g->admit_key = admit_key;
  g->ledger_prefix = a.ledger;
  g->join_record = mine.encode();
  g->check_ops = a.check_ops;
  g->take_thread();
  g->instance = a.instance;
  g->recorder = detail::FlightRecorder::create({a.name, a.instance, rank, world, info.name});
  detail::op_now();  // (as in create)
  if (auto* tcp = dynamic_cast<TCPStore*>(g->store.get()); tcp != nullptr && g->owns_store) {
    try {
      tcp->set_on_close(g->scope + "/left/" + std::to_string(rank), "closed");
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: no departure notice: {}", g->describe(), e.what());
    }
  }
  return g;
}

}  // namespace

std::shared_ptr<CollectiveGroup> CollectiveGroup::grow(const GrowOptions& options) {
  State& s = *state_;
  const std::string ctx = "grow of " + s.describe();
  if (s.forked()) throw Error(ErrorCode::kInvalidUsage, ctx + ": " + s.forked_message());
  if (s.destroyed.load()) throw Error(ErrorCode::kInvalidUsage, ctx + ": the group was destroyed");
  if (options.add < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx + ": add must be at least 1, got " + std::to_string(options.add));
  }
  if (options.name.find('\n') != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": the name must not hold a line break");
  }
  if (s.world_size > (1 << 20) - options.add) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx + ": add " + std::to_string(options.add) + " makes the group too large");
  }
  const std::chrono::milliseconds timeout = subgroup_timeout(ctx, options.timeout, s.timeout);
  BackendInfo info;
  const std::string requested = subgroup_backend(ctx, options.backend, s.backend_name, &info);
  // Collective and ordered like split: the ops queued before it finish first.
  s.drain();
  std::lock_guard<std::mutex> op_lock(s.op_mutex);
  if (s.destroyed.load()) throw Error(ErrorCode::kInvalidUsage, ctx + ": the group was destroyed");
  s.throw_if_aborted(ctx);
  const uint64_t n = s.grow_count++;
  detail::Admission a;
  a.base = s.scope + "/grow/" + std::to_string(n);
  a.ledger = s.ledger_prefix;
  a.world = s.world_size;
  a.add = options.add;
  a.requested = requested;
  a.inherited = options.backend.empty();
  a.name = options.name.empty() ? *s.name + ".grow" + std::to_string(n) : options.name;
  // The record carries at most 2^40 ms (35 years, "never" in practice): an infinite timeout,
  // milliseconds::max(), is written as that.
  a.timeout_ms = std::min<int64_t>(s.timeout.count(), int64_t{1} << 40);
  a.instance = s.instance + ".g" + std::to_string(n);
  a.check_ops = s.check_ops;
  a.meet_ms = std::min<int64_t>(timeout.count(), int64_t{1} << 40);
  const int world = a.world + a.add;
  const std::string sub_ctx = ctx + " into " + where(a.name, s.rank, world);
  // Rank 0 opens the admission; the new processes take tickets for the new ranks under it.
  if (s.rank == 0) prefixed(ctx, [&] { s.store->set(s.admit_key, a.encode()); });
  // The members' waits end when this group is aborted or destroyed from another thread.
  std::weak_ptr<State> self = state_;
  auto stoppable =
      std::make_shared<detail::StoppableStore>(s.ledger, [self]() -> detail::StoppableStore::Stop {
        auto p = self.lock();
        if (!p) return {ErrorCode::kAborted, "the group is gone"};
        if (p->destroyed.load()) return {ErrorCode::kAborted, "the group was destroyed"};
        if (p->aborted.load()) {
          std::lock_guard<std::mutex> guard(p->state_mutex);
          return {ErrorCode::kAborted, "the group was aborted (" + p->abort_reason + ")"};
        }
        return {};
      });
  const detail::JoinRecord mine = detail::JoinRecord::mine(world, a.join_label());
  const auto close_admission = [&] {
    if (s.rank != 0) return;
    try {
      s.store->compare_set(s.admit_key, a.encode(), detail::kAdmissionClosed);
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: closing the admission: {}", ctx, e.what());
    }
  };
  std::shared_ptr<State> g;
  try {
    const detail::Membership m = prefixed(sub_ctx, [&] {
      return detail::meet(*stoppable, a.base + "/group", world, s.rank, mine, timeout);
    });
    info = settled_backend(sub_ctx, requested, info, a.inherited, m.hosts());
    g = grown_state(a, m, s.rank, info, s.store, s.ledger, s.owns_store, s.caller_store, mine,
                    s.admit_key);
    attach_backend(*g, info, backend_context(*g, stoppable), sub_ctx, stoppable.get());
  } catch (const Error&) {
    // A process that comes later waits for the next grow instead of this failed one (one that
    // took a ticket already fails in the meeting, which says why).
    close_admission();
    throw;
  }
  close_admission();  // its new ranks came: the next process waits for the next grow
  stoppable->disarm();
  TUTTI_LOG_INFO("grew {} from {} with backend '{}'", g->describe(), s.describe(), info.name);
  return std::shared_ptr<CollectiveGroup>(new CollectiveGroup(std::move(g)));
}

std::shared_ptr<CollectiveGroup> CollectiveGroup::join(std::string_view group_name,
                                                       const GroupOptions& options) {
  const std::string root(group_name);
  const std::string ctx = "join of group '" + root + "'";
  if (root.empty()) throw Error(ErrorCode::kInvalidArgument, "join: group name must not be empty");
  if (options.timeout.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": timeout must be positive, got " +
                                                 std::to_string(options.timeout.count()) + " ms");
  }
  if (!options.store && options.store_url.empty() && !has_launch_env()) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx +
                    ": joining needs the members' store: set GroupOptions::store or store_url "
                    "(e.g. tcp://HOST:PORT), or run under a launcher (env://)");
  }
  detail::register_local_process();
  const auto deadline = detail::deadline_after(options.timeout);
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), detail::time_left(deadline));
  };
  // A client of the members' store (world 2, rank 1: never its host).
  const detail::StoreChoice choice =
      prefixed(ctx, [&] { return detail::resolve_store(options, 2, 1); });
  const std::string admit_key = detail::group_base(choice.job_id, root) + "/admit";
  // The members' next grow: an admission with a ticket left. One that is full (its new ranks
  // came) is waited past, until the members open another.
  detail::Admission a;
  BackendInfo info;
  int ticket = 0;
  std::string full;     // the last full admission seen
  bool closed = false;  // the last record seen said no grow is admitting
  prefixed(ctx, [&] {
    while (true) {
      std::string text;
      if (!choice.store->check({admit_key})) {
        try {
          choice.store->wait({admit_key}, left());
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kTimeout) throw;
          throw Error(ErrorCode::kTimeout,
                      "no grow of it began within " + std::to_string(options.timeout.count()) +
                          " ms (its members call CollectiveGroup::grow to admit new ranks)");
        }
      }
      text = choice.store->get(admit_key);
      closed = text == detail::kAdmissionClosed;
      if (text != full && !closed) {
        a = detail::Admission::decode(text, admit_key);
        // The backend first: a process that cannot make it takes no rank the members wait for.
        if (a.requested != "auto") info = detail::find_backend(a.requested);
        const int64_t t = choice.store->add(a.base + "/tickets", 1);
        // A ticket of a grow that ended meanwhile (rank 0 closed or replaced its admission) is
        // no rank: wait for the next.
        if (t >= 1 && t <= a.add && choice.store->get(admit_key) == text) {
          ticket = static_cast<int>(t);
          return;
        }
        full = text;
      }
      if (Clock::now() >= deadline && (closed || a.base.empty())) {
        throw Error(ErrorCode::kTimeout,
                    "no grow of it began within " + std::to_string(options.timeout.count()) +
                        " ms" + (closed ? " (the last one ended before this process came)" : ""));
      }
      if (Clock::now() >= deadline) {
        throw Error(ErrorCode::kTimeout, "no grow of it admitted this process within " +
                                             std::to_string(options.timeout.count()) +
                                             " ms (the last, into '" + a.name + "', admitted " +
                                             std::to_string(a.add) + " rank(s), and they came)");
      }
      std::this_thread::sleep_for(std::min(std::chrono::milliseconds(20), left()));
    }
  });
  const int world = a.world + a.add;
  const int rank = a.world + ticket - 1;
  const std::string sub_ctx = ctx + " into " + where(a.name, rank, world);
  auto ledger = std::make_shared<detail::LedgerStore>(choice.store, a.ledger);
  const detail::JoinRecord mine = detail::JoinRecord::mine(world, a.join_label());
  // In the meeting it waits as long as the members do, whatever is left of its own timeout.
  const detail::Membership m = prefixed(sub_ctx, [&] {
    return detail::meet(*ledger, a.base + "/group", world, rank, mine,
                        std::max(left(), std::chrono::milliseconds(a.meet_ms)));
  });
  info = settled_backend(sub_ctx, a.requested, info, a.inherited, m.hosts());
  auto g = grown_state(a, m, rank, info, choice.store, ledger, choice.owned, !choice.owned, mine,
                       admit_key);
  try {
    attach_backend(*g, info, backend_context(*g), sub_ctx);
  } catch (const Error&) {
    detail::forget_join(mine);
    throw;
  }
  TUTTI_LOG_INFO("joined {} grown with backend '{}'", g->describe(), info.name);
  return std::shared_ptr<CollectiveGroup>(new CollectiveGroup(std::move(g)));
}

std::shared_ptr<Backend> CollectiveGroup::State::current_backend() const {
  std::lock_guard<std::mutex> lock(state_mutex);
  return backend;
}

void CollectiveGroup::State::throw_if_aborted(const std::string& what) const {
  if (!aborted.load()) return;
  std::lock_guard<std::mutex> guard(state_mutex);
  throw Error(ErrorCode::kAborted, what + ": the group was aborted (" + abort_reason + ")");
}

void CollectiveGroup::State::abort(const std::string& reason) {
  std::shared_ptr<Backend> b;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    first = abort_reason.empty();
    if (first) abort_reason = reason;
    aborted.store(true);
    b = backend;
  }
  if (b) {
    try {
      b->abort(reason);
    } catch (const std::exception& e) {
      TUTTI_LOG_WARN("aborting {}: {}", describe(), e.what());
    }
  }
  // After the backend's abort: ops that it ended are on record as failed by the time of the
  // dump more often (the dump never waits for them).
  if (first && recorder) recorder->dump("aborted: " + reason);
}

void CollectiveGroup::State::record_failure(const OpContext& ctx, const Error& e) {
  if (!aborts_group(e.code())) return;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    first = abort_reason.empty();
  }
  // The message already names the op and the group.
  if (first) TUTTI_LOG_ERROR("{}; aborting the group", e.what());
  // The reason goes into messages that name the group (and, through the backend, other ranks'
  // messages that name theirs): it names the op, not the group again.
  std::string reason = e.what();
  const std::string prefix = ctx.description() + ": ";
  if (reason.compare(0, prefix.size(), prefix) == 0) {
    reason = std::string(to_string(ctx.op)) + " #" + std::to_string(ctx.seq) +
             " failed: " + reason.substr(prefix.size());
  }
  abort(reason);
}

void CollectiveGroup::abort(const std::string& reason) {
  // A forked child must not reach the parent's connections or segment (see destroy).
  if (state_->forked()) return;
  if (state_->destroyed.load() && !state_->current_backend()) return;
  TUTTI_LOG_WARN("{}: abort: {}", describe(), reason);
  state_->abort(reason);
}

void CollectiveGroup::destroy() noexcept {
  State& s = *state_;
  if (s.destroyed.exchange(true)) return;
  if (s.forked()) {
    // In a forked child everything the group holds is the parent's: its threads exist only
    // there (joining them would wait forever), closing its Gloo pairs would take the parent's
    // sockets out of their shared epoll set, and leaving the segment or the store would tell the
    // parent's peers that it left. The child leaves it all be: the state is kept, never freed.
    detail::keep_forever(state_);
    return;
  }
  // What follows may wait (the worker, the backend's threads, the store): a binding lets go of
  // its own lock meanwhile (Python's GIL, where the group went with its last Python reference).
  const detail::BlockingScope blocking;
  try {
    // An op running in another thread (it holds the op lock), or queued, ends now (kAborted)
    // instead of at its timeout.
    {
      std::unique_lock<std::mutex> busy(s.op_mutex, std::try_to_lock);
      if (!busy.owns_lock() || s.queued.load() > 0) {
        if (busy.owns_lock()) busy.unlock();
        s.abort("the group was destroyed while an op was running");
      }
    }
    {
      // No inline op runs past this point, and none is queued after it (begin() sees
      // `destroyed` under this lock).
      std::lock_guard<std::mutex> lock(s.op_mutex);
      if (s.queued.load() > 0) s.abort("the group was destroyed while an op was queued");
    }
    // Without the op lock: a hook still running on the worker may issue an op (it fails,
    // destroyed) rather than wait for the lock while this joins the worker; and from a hook on
    // the worker itself, the ops drained here run on this thread.
    s.queue.stop();
    std::shared_ptr<Backend> backend;
    {
      std::lock_guard<std::mutex> lock(s.state_mutex);
      backend.swap(s.backend);
    }
    backend.reset();
    leave_store();
    TUTTI_LOG_DEBUG("destroyed {}", describe());
  } catch (const std::exception& e) {
    TUTTI_LOG_WARN("destroying {}: {}", describe(), e.what());
  } catch (...) {
    TUTTI_LOG_WARN("destroying {}: unknown exception", describe());
  }
}

void CollectiveGroup::leave_store() {
  State& s = *state_;
  const detail::JoinRecord mine = detail::JoinRecord::decode(s.join_record);
  detail::forget_join(mine);
  auto* tcp = dynamic_cast<TCPStore*>(s.store.get());
  // A TCP store the caller gave a root group (GroupOptions::store) is treated as one the group
  // opened: its host keeps serving until the others have left. A caller that drops its store
  // right after destroy (tutti.ray does) would otherwise leave the others' teardown waiting out
  // their store timeout. Only the timeout of a store the group opened is the group's to cut.
  const bool lingers = s.owns_store || (s.caller_store && !s.aborted.load());
  if (tcp != nullptr && s.world_size > 1 && lingers) {
    // Best effort and brief: a host that is already gone must not hold destroy up. Not while
    // splits or a shrink's survivors share the store object: their requests would be cut too
    // (and the timeout changed under their threads).
    // Alone: the group's own reference and its ledger's (which wraps the store) are the only ones.
    const bool alone =
        s.store.use_count() == (s.ledger ? 2 : 1) && (!s.ledger || s.ledger.use_count() == 1);
    if (s.owns_store && alone) tcp->set_timeout(std::chrono::milliseconds(2000));
    try {
      detail::leave(*tcp, s.scope, s.rank, mine);
      tcp->set(s.scope + "/left/" + std::to_string(s.rank), "1");
      // The host keeps serving for the others on a thread of its own (destroy never waits on
      // a peer); an aborted group's peers may be gone or stuck: it does not wait for them.
      if (tcp->is_hosting() && !s.aborted.load()) {
        std::vector<std::string> keys;
        for (int r = 0; r < s.world_size; ++r)
          keys.push_back(s.scope + "/left/" + std::to_string(r));
        LingeringStores::get().add(s.store, std::move(keys),
                                   s.scope + "/left/" + std::to_string(s.rank));
      }
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: leaving the store: {}", describe(), e.what());
    }
  } else if (s.store && !s.aborted.load()) {
    try {
      detail::leave(*s.store, s.scope, s.rank, mine);
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: giving the claim back: {}", describe(), e.what());
    }
  }
  if (s.rank == 0 && !s.base.empty() && s.store) {
    // The incarnations before this one are over (this one formed): their keys can go, so a
    // long-lived store holds one incarnation's keys per group name, not every one's.
    try {
      const size_t n = detail::purge_incarnations(*s.store, s.base, s.incarnation, s.world_size);
      if (n > 0) TUTTI_LOG_DEBUG("{}: deleted {} keys of earlier incarnations", describe(), n);
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: deleting earlier incarnations' keys: {}", describe(), e.what());
    }
  }
  std::lock_guard<std::mutex> guard(s.state_mutex);  // against a local split taking them
  s.ledger.reset();
  s.store.reset();
}

namespace detail {
void wait_for_lingering_stores() {
  LingeringStores::get().wait(/*exiting=*/true);
}
}  // namespace detail

}  // namespace tutti
