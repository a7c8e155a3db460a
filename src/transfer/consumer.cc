// The consumer's get and borrow: the resolution of a ref to a road (a transport, its two-sided
// group, or the owner's stream), one copy path for all of them, and gets of this agent's own
// objects (agent_core.h, consumer.h).
#include <algorithm>
#include <cstring>
#include <thread>

#include "transfer/consumer.h"
#include "util/deadline.h"
#include "util/logging.h"
#include "util/shared_memory.h"

namespace tutti::detail {
namespace {

void check_targets(const AgentCore& core, const char* op, const TensorRef& ref,
                   const std::vector<TensorView>& targets, bool cuda = false) {
  auto context = [&] { return core.context(op, ref); };
  const auto& metas = ref.tensors();
  if (targets.empty()) return;
  if (targets.size() != metas.size()) {
    throw Error(ErrorCode::kInvalidArgument, context() + ": " + std::to_string(targets.size()) +
                                                 " targets for " + std::to_string(metas.size()) +
                                                 " tensors");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const TensorView& t = targets[i];
    const TensorMeta& m = metas[i];
    if (t.dtype() != m.dtype ||
        static_cast<uint64_t>(t.numel()) != static_cast<uint64_t>(m.numel())) {
      throw Error(ErrorCode::kInvalidArgument, context() + ": target " + std::to_string(i) +
                                                   " is " + t.str() + ", the tensor is " + m.str());
    }
    if ((t.device().type == DeviceType::kCUDA) != cuda) {
      throw Error(ErrorCode::kInvalidArgument, context() + ": target " + std::to_string(i) +
                                                   " is on " + t.device().str() + "; transport '" +
                                                   ref.transport() + "' receives into " +
                                                   (cuda ? "CUDA" : "CPU") + " memory");
    }
  }
  // Targets may not share bytes: sorted by address, each ends before the next begins.
  std::vector<std::pair<uintptr_t, size_t>> spans;  // (start, index)
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].nbytes() > 0)
      spans.emplace_back(reinterpret_cast<uintptr_t>(targets[i].data()), i);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const TensorView& prev = targets[spans[k - 1].second];
    if (spans[k - 1].first + prev.nbytes() > spans[k].first) {
      throw Error(ErrorCode::kInvalidArgument,
                  context() + ": targets " +
                      std::to_string(std::min(spans[k - 1].second, spans[k].second)) + " and " +
                      std::to_string(std::max(spans[k - 1].second, spans[k].second)) + " overlap");
    }
  }
}

// Buffers get allocates when it is given no targets.
std::vector<TensorView> allocate_targets(const TensorRef& ref,
                                         std::vector<std::shared_ptr<void>>& storage) {
  std::vector<size_t> bytes;
  for (const TensorMeta& m : ref.tensors()) bytes.push_back(m.nbytes());
  std::vector<std::shared_ptr<void>> buffers = receive_buffers(bytes);
  std::vector<TensorView> out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const TensorMeta& m = ref.tensors()[i];
    out.emplace_back(buffers[i].get(), m.dtype, m.shape, Device::cpu());
    storage.push_back(std::move(buffers[i]));
  }
  return out;
}

}  // namespace

std::string AgentCore::context(const char* op, const TensorRef& ref) const {
  return std::string(op) + " of " + ref.describe() + " on " + who();
}

void AgentCore::verify_own(const TensorRef& ref, const char* op) const {
  if (!options.secret.empty() && !ref.verify(options.secret)) {
    throw Error(ErrorCode::kInvalidArgument,
                context(op, ref) + ": the ref is " +
                    (ref.is_signed() ? "signed with another secret" : "not signed") +
                    " (this agent only takes refs signed with its secret)");
  }
}

AgentCore::Resolved AgentCore::resolve(const TensorRef& ref, const GetOptions& opts,
                                       const char* op) {
  Resolved r;
  verify_own(ref, op);
  r.ref = ref;
  r.name = ref.transport();
  r.local = ref.owner().same_host(identity);
  TensorTransport* t = &transport(r.name);  // kUnavailable when not registered
  check_targets(*this, op, ref, opts.targets, t->traits().cuda);
  const Reach reach = t->reach(ref, identity);
  if (!reach.direct) {
    // The socket transport instead, where asked for and possible: CPU tensors, and an owner
    // this agent can connect to (on this host, or listening on TCP).
    if (!opts.allow_fallback || t->traits().cuda ||
        (!r.local && ref.owner().tcp_endpoint.empty())) {
      throw Error(reach.code, context(op, ref) + ": " + reach.why);
    }
    r.peer = peer_for(ref.owner(), r.local);
    r.transport = t;
    choose_across(r);  // the socket stream, or across hosts one both may have (ucx)
    TUTTI_LOG_DEBUG("direct transport: {}: goes over '{}' ({})", context(op, ref), r.name,
                    reach.why);
    t = r.transport;
  }
  r.transport = t;
  if (!r.peer) r.peer = peer_for(ref.owner(), r.local);
  if (r.local && (r.peer->owner.pid != ref.owner().pid ||
                  r.peer->owner.start_time != ref.owner().start_time)) {
    throw Error(ErrorCode::kInvalidArgument,
                context(op, ref) + ": the ref names pid " + std::to_string(ref.owner().pid) +
                    " for an agent that runs as " + owner_text(r.peer->owner));
  }
  return r;
}

void AgentCore::copy_into(Resolved& r, PeerLink& link, const std::vector<TensorView>& targets,
                          Clock::time_point deadline, const std::atomic<bool>& cancelled,
                          void* stream) {
  const FetchRequest request{r.ref, link, targets, false, deadline, cancelled, stream};
  if (r.transport->traits().holds_itself) {
    // The owner holds the object for the fetch (the socket stream, a two-sided send) and counts
    // the completed get: no lease. A two-sided owner sends on the thread that serves the call's
    // connection: kept for this get (PeerLink::keep_connection).
    link.set_stream_counts(true);
    link.keep_connection();
    r.transport->fetch(request);
    return;
  }
  LeaseGuard lease(*this, r, take_lease(r, link, deadline, cancelled));
  r.transport->fetch(request);
  arrived(r);  // a failure ending the lease is not the transport's
  lease.complete(link);
}

Received AgentCore::get(const TensorRef& ref, const GetOptions& opts,
                        const std::atomic<bool>* cancelled_in) {
  std::atomic<bool> own_flag{false};
  std::atomic<bool>* flag =
      cancelled_in != nullptr ? const_cast<std::atomic<bool>*>(cancelled_in) : &own_flag;
  ActiveGet active_get(*this, flag);
  const auto deadline = deadline_after(opts.timeout.count() > 0 ? opts.timeout : fetch_timeout);
  try {
    // A get that begins as the agent stops (get_async's queued at stop) ends at once, and so
    // does one of get_async's that was cancelled or aborted while queued.
    if (stopping) throw Error(ErrorCode::kAborted, who() + " is shutting down");
    if (flag->load()) throw Error(ErrorCode::kAborted, "cancelled");
    if (ref.owner().uuid == identity.uuid) {
      verify_own(ref, "get");
      const bool cuda = !ref.tensors().empty() && ref.tensors()[0].device.type == DeviceType::kCUDA;
      if (cuda && !opts.targets.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "the ref is this agent's own CUDA object: get it without targets (its own "
                    "tensors) and copy on your stream");
      }
      check_targets(*this, "get", ref, opts.targets);
      if (opts.copy_on_write && opts.targets.empty() && !cuda) {
        // Writes must stay the caller's: a copy, not the owner's own tensors.
        Received out;
        const std::vector<TensorView> targets = allocate_targets(ref, out.storage_);
        out.views_ = get_own(ref, targets, false, deadline, *flag).first.views_;
        out.transport_ = ref.transport();
        return out;
      }
      Received own = get_own(ref, opts.targets, false, deadline, *flag).first;
      own.transport_ = ref.transport();
      return own;
    }
    Resolved r = resolve(ref, opts, "get");
    if (opts.targets.empty() && r.transport->traits().cuda) {
      throw Error(ErrorCode::kInvalidArgument,
                  "transport '" + r.name + "' receives into CUDA memory: give targets");
    }
    while (true) {
      try {
        return get_resolved(r, opts, deadline, *flag);
      } catch (const Error& e) {
        if (!retry_on_socket(r, e, deadline, *flag)) throw;
      }
    }
  } catch (const Error& e) {
    const std::string context = this->context("get", ref);
    if (flag->load() && e.code() != ErrorCode::kInvalidArgument) {
      throw Error(ErrorCode::kAborted, context + ": cancelled (" + e.what() + ")");
    }
    if (e.code() == ErrorCode::kTimeout && Clock::now() >= deadline) {
      throw Error(
          ErrorCode::kTimeout,
          context + ": not done after " +
              std::to_string((opts.timeout.count() > 0 ? opts.timeout : fetch_timeout).count()) +
              " ms, waiting for " + owner_text(ref.owner()) + " (" + e.what() + ")");
    }
    rethrow_io(context, ref.owner(), identity, e);
  }
}

Received AgentCore::get_resolved(Resolved& r, const GetOptions& opts, Clock::time_point deadline,
                                 std::atomic<bool>& flag) {
  Received out;
  std::vector<TensorView> targets = opts.targets;
  PeerLink link(*this, r.peer, deadline, &flag, r.ref.object());
  link.set_transport(r.name);
  publish_across(r, link, deadline);
  // The transfer's deadline (the link's requests keep the get's: ending a lease after the bytes
  // arrived must not fail for the trial's half).
  const Clock::time_point until = trial_until(r, deadline);
  out.transport_ = r.name;
  if (targets.empty() && opts.copy_on_write && r.transport->traits().can_borrow) {
    // The owner's memory, mapped privately where the transport can: the Received holds the
    // object while its views may still show the owner's pages.
    Lent lent = lend(r, link, /*writable=*/true, until, flag, opts.stream);
    out.views_ = std::move(lent.views);
    out.storage_.emplace_back(std::shared_ptr<HeldLease>(std::move(lent.lease)));
    return out;
  }
  if (targets.empty()) targets = allocate_targets(r.ref, out.storage_);
  copy_into(r, link, targets, until, flag, opts.stream);
  out.views_ = std::move(targets);
  return out;
}

Borrowed AgentCore::borrow(const TensorRef& ref, const GetOptions& opts) {
  std::atomic<bool> flag{false};
  ActiveGet active_get(*this, &flag);
  const auto deadline = deadline_after(opts.timeout.count() > 0 ? opts.timeout : fetch_timeout);
  if (!opts.targets.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                context("borrow", ref) + ": borrow takes no targets (use get)");
  }
  try {
    Borrowed out;
    if (ref.owner().uuid == identity.uuid) {
      verify_own(ref, "borrow");
      auto [received, lease] = get_own(ref, {}, true, deadline, flag);
      out.views_ = received.views_;
      out.lease_ = std::move(lease);
      return out;
    }
    Resolved r = resolve(ref, opts, "borrow");
    while (true) {
      try {
        PeerLink link(*this, r.peer, deadline, &flag, ref.object());
        link.set_transport(r.name);
        publish_across(r, link, deadline);
        const Clock::time_point until = trial_until(r, deadline);
        Lent lent = lend(r, link, /*writable=*/false, until, flag, opts.stream);
        out.views_ = std::move(lent.views);
        out.lease_ = std::move(lent.lease);
        return out;
      } catch (const Error& e) {
        if (!retry_on_socket(r, e, deadline, flag)) throw;
      }
    }
  } catch (const Error& e) {
    const std::string context = this->context("borrow", ref);
    if (flag.load()) throw Error(ErrorCode::kAborted, context + ": cancelled (" + e.what() + ")");
    rethrow_io(context, ref.owner(), identity, e);
  }
}

AgentCore::Lent AgentCore::lend(Resolved& r, PeerLink& link, bool writable,
                                Clock::time_point deadline, const std::atomic<bool>& cancelled,
                                void* stream) {
  const TensorRef& ref = r.ref;
  Lent out;
  out.lease = std::make_unique<HeldLease>();
  if (!r.transport->traits().can_borrow) {
    // Nothing to lend in place: a private copy, held like a borrow.
    if (r.transport->traits().cuda) {
      throw Error(ErrorCode::kInvalidArgument,
                  "transport '" + r.name + "' cannot lend views: get into CUDA targets");
    }
    auto storage = std::make_shared<std::vector<std::shared_ptr<void>>>();
    out.views = allocate_targets(ref, *storage);
    copy_into(r, link, out.views, deadline, cancelled, stream);
    out.lease->end = [storage] {};
    return out;
  }
  LeaseGuard guard(*this, r, take_lease(r, link, deadline, cancelled));
  static const std::vector<TensorView> kNone;
  FetchResult fetched = r.transport->fetch(
      FetchRequest{ref, link, kNone, true, deadline, cancelled, stream, writable});
  arrived(r);  // lent: a later failure is not the transport's
  if (fetched.views.size() != ref.tensors().size()) {
    throw Error(ErrorCode::kInternal, "transport '" + r.name + "' lent " +
                                          std::to_string(fetched.views.size()) + " views for " +
                                          std::to_string(ref.tensors().size()) + " tensors");
  }
  out.views = std::move(fetched.views);
  out.shares_owner_memory = fetched.shares_owner_memory;
  if (!out.shares_owner_memory) {
    // Every view is the transport's own copy: the object may go now.
    guard.complete(link);
    out.lease->end = [keep = std::move(fetched.keep)] {};
    return out;
  }
  // From here the views hold the lease: it ends when they go (or at once, should counting the
  // get fail below).
  const Lease lease = guard.release();
  auto self = shared_from_this();
  out.lease->end = [self, r, lease, keep = std::move(fetched.keep)]() mutable {
    if (self->forked()) return;  // the lease is the parent's
    try {
      PeerLink link(*self, r.peer, deadline_after(std::chrono::seconds(1)), nullptr,
                    r.ref.object());
      self->end_lease(*r.peer, link, r.ref.object(), lease, false);
    } catch (const std::exception& e) {
      TUTTI_LOG_DEBUG("direct transport: ending a borrow of {}: {}", r.ref.describe(), e.what());
    }
  };
  count_get(*r.peer, link, r.ref.object(), lease);
  return out;
}

// This agent's own object: no copy unless targets are given; `lease` holds the object.
std::pair<Received, std::unique_ptr<HeldLease>> AgentCore::get_own(
    const TensorRef& ref, const std::vector<TensorView>& targets, bool borrow,
    Clock::time_point deadline, const std::atomic<bool>& cancelled) {
  const uint64_t id = ref.object().id;
  const uint32_t gen = ref.object().generation;
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    auto it = objects.find(id);
    if (it == objects.end() || it->second.generation != gen) {
      throw Error(ErrorCode::kInvalidUsage, "the object " + freed_text_locked(id));
    }
    Object& o = it->second;
    if (o.state == kSlotFailed) {
      throw Error(ErrorCode::kRemoteError, "the owner failed it: " + o.failure);
    }
    if (o.state == kSlotRetiring) {
      throw Error(ErrorCode::kInvalidUsage, "the object is being freed (nothing pins it)");
    }
    if (o.state == kSlotLive) break;
    if (cancelled.load()) throw Error(ErrorCode::kAborted, "cancelled");
    if (Clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout, "the object is still reserved (never fulfilled)");
    }
    changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(20)));
  }
  Object& o = objects.find(id)->second;
  // The ref may be stale or made up: it must describe the object exactly, and targets may not
  // overlap its tensors.
  const auto& metas = ref.tensors();
  bool same = metas.size() == o.metas.size();
  for (size_t i = 0; same && i < metas.size(); ++i) {
    same = metas[i].dtype == o.metas[i].dtype && metas[i].shape == o.metas[i].shape &&
           metas[i].device == o.metas[i].device;
  }
  if (!same) {
    throw Error(ErrorCode::kInvalidArgument, "the ref describes " + std::to_string(metas.size()) +
                                                 " tensor(s) unlike the object's (" +
                                                 std::to_string(o.metas.size()) +
                                                 "): it was altered or made up");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto* a = static_cast<const char*>(targets[i].data());
    const auto* b = static_cast<const char*>(o.tensors[i].data());
    const size_t n = targets[i].nbytes();
    if (n > 0 && a < b + n && b < a + n) {
      throw Error(ErrorCode::kInvalidArgument,
                  "target " + std::to_string(i) + " overlaps the object's own tensor");
    }
  }
  ++o.local_leases;
  count_get_locked(o);  // counted at once: the hold keeps it until the copy or borrow ends
  const std::vector<TensorView> tensors = o.tensors;
  lock.unlock();
  auto lease = std::make_unique<HeldLease>();
  std::weak_ptr<AgentCore> weak = weak_from_this();
  lease->end = [weak, id] {
    if (auto self = weak.lock(); self && !self->forked()) self->release_hold(id, false);
  };
  Received out;
  if (!targets.empty()) {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (tensors[i].nbytes() > 0)
        std::memcpy(targets[i].data(), tensors[i].data(), tensors[i].nbytes());
    }
    out.views_ = targets;
    lease.reset();  // copied: the hold ends now
    return {std::move(out), nullptr};
  }
  out.views_.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta& m = ref.tensors()[i];
    out.views_.emplace_back(tensors[i].data(), m.dtype, m.shape, m.device);
  }
  if (!borrow) {
    // A get without targets shares the owner's tensors; the Received holds the object.
    std::shared_ptr<HeldLease> held(std::move(lease));
    out.storage_.push_back(held);
    return {std::move(out), nullptr};
  }
  return {std::move(out), std::move(lease)};
}

}  // namespace tutti::detail
