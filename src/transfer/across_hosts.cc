// Across hosts, both halves: a consumer on another host whose ref's transport works on one host
// (shm) takes the owner's socket stream, or a one-sided transport for other hosts that both agents
// have (ucx), on which the owner publishes the object when asked (kPublish; agent_core.h,
// consumer.h).
#include "transfer/consumer.h"
#include "transfer/publication_wire.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// The owner is not asked for `name` again (its process lacks it, or it failed there).
void decline(Peer& peer, const std::string& name, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(peer.mutex);
    if (!peer.declined.insert(name).second) return;
  }
  TUTTI_LOG_WARN("direct transport: gets from {} take its socket stream, not '{}': {}",
                 owner_text(peer.owner), name, why);
}

// The owner's socket stream for this get.
void to_socket(AgentCore& core, AgentCore::Resolved& r) {
  r.name = "socket";
  r.transport = &core.transport(r.name);
}

}  // namespace

// ---- the owner ----

AgentCore::AlsoPublished AgentCore::publish_also(uint64_t id, uint32_t gen, const std::string& name,
                                                 Clock::time_point deadline,
                                                 const std::function<void()>& each_slice) {
  AlsoPublished out;
  // Only a transport the registry says reaches other hosts one-sidedly is made here: the name
  // comes from the consumer.
  TensorTransport* t = nullptr;
  if (tls_server && across_hosts_setting() != name) {
    // An owner in TLS sends its objects' bytes in TLS only, unless its own setting names the
    // transport.
    out.why = "this owner takes TLS connections (TUTTI_TRANSFER_TLS=1) and does not name '" + name +
              "' in TUTTI_TRANSFER_ACROSS_HOSTS";
  } else if (is_across_hosts_transport(name)) {
    try {
      t = &transport(name);
    } catch (const Error& e) {
      out.why = e.what();
    }
  } else {
    out.why = "no transport '" + name + "' for other hosts is loaded here";
  }
  if (t == nullptr) {
    out.status = AlsoPublished::kNotHere;
    return out;
  }
  // Live until released; waits while it is reserved.
  const std::vector<TensorView> tensors = hold(id, gen, deadline, nullptr, each_slice);
  struct Unhold {
    AgentCore& core;
    uint64_t id;
    ~Unhold() { core.release_hold(id, false); }
  } unhold{*this, id};
  // One at a time: a second consumer asking for the same object takes the first's publication.
  std::lock_guard<std::mutex> serial(also_mutex);
  uint32_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    Object& o = find_locked(id, gen);  // the agent may have stopped meanwhile
    out.tensors = o.metas.size();
    if (o.t == t) {
      out.pub = o.publication;
      return out;
    }
    if (auto it = o.also.find(name); it != o.also.end()) {
      out.pub = it->second.second;
      return out;
    }
    if (!o.metas.empty() && o.metas[0].device.type != DeviceType::kCPU) {
      out.status = AlsoPublished::kNotThisObject;
      out.why = "it holds " + o.metas[0].device.str() + " tensors";
      return out;
    }
    slot = o.slot;
  }
  try {
    out.pub = t->publish(PublishRequest{ObjectId{id, gen, slot}, tensors});
  } catch (const Error& e) {
    out.status = AlsoPublished::kNotThisObject;
    out.why = e.what();
    return out;
  }
  if (out.pub.blob.size() > TensorRef::kMaxBlob) {
    t->unpublish(ObjectId{id, gen, slot});
    out.status = AlsoPublished::kNotThisObject;
    out.why = "the transport describes it in " + std::to_string(out.pub.blob.size()) + " bytes";
    return out;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end() || it->second.generation != gen) {
    t->unpublish(ObjectId{id, gen, slot});  // freed by stop() meanwhile
    throw Error(ErrorCode::kAborted, who() + " stopped");
  }
  it->second.also.emplace(name, std::make_pair(t, out.pub));
  return out;
}

std::string AgentCore::answer_publish(WireReader& r, const std::function<void()>& each_slice) {
  const uint64_t id = r.u64("id");
  const uint32_t gen = r.u32("generation");
  const std::string name = transport_key(r.str8("transport"));
  const auto deadline = wire_deadline(r.u64("timeout"));
  const AlsoPublished also = publish_also(id, gen, name, deadline, each_slice);
  WireWriter w;
  w.u8(also.status);
  if (also.status == AlsoPublished::kPublished) {
    write_publication(w, also.pub, also.tensors);
  } else {
    w.str32(also.why);
  }
  return std::move(w.out());
}

// ---- the consumer ----

void AgentCore::choose_across(Resolved& r) {
  std::string across =
      r.local ? "" : across_hosts_transport(DeviceType::kCPU, tls_client != nullptr);
  if (!across.empty()) {
    std::lock_guard<std::mutex> lock(r.peer->mutex);
    if (r.peer->declined.count(across) > 0) across.clear();
  }
  if (!across.empty()) {
    try {
      r.transport = &transport(across);
      r.name = across;
      r.republish = true;
      return;
    } catch (const Error& e) {
      decline(*r.peer, across, std::string("it cannot start here: ") + e.what());
    }
  }
  to_socket(*this, r);
}

void AgentCore::publish_across(Resolved& r, PeerLink& link, Clock::time_point deadline) {
  if (!r.republish) return;
  r.republish = false;
  const ObjectId object = r.ref.object();
  const auto key = std::make_tuple(r.name, object.id, object.generation);
  Publication pub;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(r.peer->mutex);
    auto it = r.peer->also.find(key);
    if ((known = it != r.peer->also.end())) pub = it->second;
  }
  if (!known) {
    WireWriter w;
    w.u64(object.id);
    w.u32(object.generation);
    w.str8(r.name);
    w.u64(wire_timeout(deadline));
    uint8_t status = 0;
    std::string why;
    try {
      Message m = link.request(MsgType::kPublish, w.out());
      WireReader rd(m.payload, "a publish reply from " + owner_text(r.ref.owner()));
      status = rd.u8("status");
      if (status == AlsoPublished::kPublished) {
        pub = read_publication(rd, r.ref.tensors().size());
      } else {
        why = rd.str32("why", 1u << 20);
      }
    } catch (const Error& e) {
      // An owner from before kPublish does not know the request.
      if (e.code() != ErrorCode::kInvalidArgument ||
          std::string(e.what()).find("of unknown type") == std::string::npos) {
        throw;
      }
      status = AlsoPublished::kNotHere;
      why = e.what();
    }
    if (status != AlsoPublished::kPublished) {
      if (status == AlsoPublished::kNotHere) {
        decline(*r.peer, r.name, "not at the owner (" + why + ")");
      } else {
        TUTTI_LOG_DEBUG("direct transport: {} cannot publish object {} on '{}' ({}): the socket",
                        owner_text(r.ref.owner()), object.id, r.name, why);
      }
      to_socket(*this, r);
      link.set_transport(r.name);
      return;
    }
    std::lock_guard<std::mutex> lock(r.peer->mutex);
    if (r.peer->also.size() >= 256) r.peer->also.erase(r.peer->also.begin());
    r.peer->also.emplace(key, pub);
  }
  r.given = r.ref;  // for a retry over the socket stream
  r.ref = TensorRef(r.ref.owner(), object, r.name, r.ref.tensors(), pub.places, pub.blob,
                    /*two_sided=*/false);
  r.across = true;
}

bool AgentCore::retry_on_socket(Resolved& r, const Error& e, Clock::time_point deadline,
                                const std::atomic<bool>& cancelled) {
  const ErrorCode c = e.code();
  // A first get that ran out of its half of the time: the transport fails slowly or not at all
  // between these two (packets dropped on the way), and the socket stream has the rest.
  const bool trial_timed_out = r.trial && c == ErrorCode::kTimeout;
  if (!r.across || cancelled.load() || Clock::now() >= deadline ||
      (c != ErrorCode::kIoError && c != ErrorCode::kUnavailable && c != ErrorCode::kInternal &&
       !trial_timed_out)) {
    return false;
  }
  decline(*r.peer, r.name,
          trial_timed_out ? std::string("a first get over it did not finish within half the "
                                        "get's timeout: ") +
                                e.what()
                          : std::string("a get over it failed: ") + e.what());
  r.ref = r.given;
  r.across = false;
  r.trial = false;
  to_socket(*this, r);
  return true;
}

Clock::time_point AgentCore::trial_until(Resolved& r, Clock::time_point deadline) {
  if (!r.across) return deadline;
  {
    std::lock_guard<std::mutex> lock(r.peer->mutex);
    if (r.peer->proven.count(r.name) > 0) return deadline;
  }
  r.trial = true;
  const Clock::time_point now = Clock::now();
  return deadline > now ? now + (deadline - now) / 2 : deadline;
}

void AgentCore::arrived(Resolved& r) {
  if (r.trial) {
    std::lock_guard<std::mutex> lock(r.peer->mutex);
    r.peer->proven.insert(r.name);
  }
  r.across = false;
  r.trial = false;
}

}  // namespace tutti::detail
