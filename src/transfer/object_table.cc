// The owner's objects: publish, fulfil and fail; the holds transfers take; settling and freeing
// (agent_core.h).
#include <algorithm>
#include <cstring>

#include "transfer/agent_core.h"
#include "util/logging.h"
#include "util/shared_memory.h"

namespace tutti::detail {
namespace {

std::string seconds_ago(Clock::time_point t) {
  const double s = std::chrono::duration<double>(Clock::now() - t).count();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

// Throws unless the object can be served now: kTimeout while still reserved, kRemoteError once
// failed (its message), kInvalidUsage while being freed.
void require_live(const Object& o) {
  if (o.state == kSlotReserved) {
    throw Error(ErrorCode::kTimeout,
                "object " + std::to_string(o.id) + " is still reserved (never fulfilled)");
  }
  if (o.state == kSlotFailed)
    throw Error(ErrorCode::kRemoteError, "the owner failed it: " + o.failure);
  if (o.state != kSlotLive) {
    throw Error(ErrorCode::kInvalidUsage,
                "object " + std::to_string(o.id) + " is being freed at its owner");
  }
}

}  // namespace

std::vector<TensorView> snapshot_copy(TensorTransport& t, const std::vector<TensorView>& tensors,
                                      std::vector<std::shared_ptr<void>>& storage) {
  std::vector<TensorView> out;
  for (const TensorView& src : tensors) {
    TensorView copy;
    try {
      copy = t.allocate(std::max<size_t>(src.nbytes(), 1), DType::kUInt8);
      TensorTransport* owner = &t;
      storage.emplace_back(copy.data(), [owner, copy](void*) { owner->deallocate(copy); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnavailable) throw;
      storage.push_back(receive_buffer(src.nbytes()));
      copy = TensorView(storage.back().get(), DType::kUInt8,
                        {static_cast<int64_t>(std::max<size_t>(src.nbytes(), 1))});
    }
    if (src.nbytes() > 0) std::memcpy(copy.data(), src.data(), src.nbytes());
    out.emplace_back(copy.data(), src.dtype(), src.shape(), src.device());
  }
  return out;
}

uint32_t AgentCore::take_slot_locked() {
  if (stopping) throw Error(ErrorCode::kInvalidUsage, "put on " + who() + ": the agent is gone");
  if (!free_slots.empty()) {
    const uint32_t slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }
  if (next_slot < SlotPage::kCapacity) return next_slot++;
  throw Error(ErrorCode::kUnavailable, "put on " + who() + ": " +
                                           std::to_string(SlotPage::kCapacity) +
                                           " objects are live; release some handles first");
}

ObjectHandle AgentCore::publish(const std::vector<TensorView>& tensors,
                                const std::vector<TensorMeta>& metas, const PutOptions& opts,
                                bool reserved) {
  const Device device = metas.empty() ? Device::cpu() : metas[0].device;
  std::string name;
  try {
    name = resolve_transport(opts.transport, device.type);
  } catch (const Error& e) {
    throw Error(e.code(), (reserved ? "reserve on " : "put on ") + who() + ": tensor 0 is on " +
                              device.str() + "; " + e.what());
  }
  TensorTransport& t = transport(name);
  const bool cuda = t.traits().cuda;
  for (size_t i = 0; i < metas.size(); ++i) {
    if ((metas[i].device.type == DeviceType::kCUDA) != cuda) {
      throw Error(ErrorCode::kInvalidArgument,
                  (reserved ? "reserve on " : "put on ") + who() + ": tensor " + std::to_string(i) +
                      " is on " + metas[i].device.str() + "; transport '" + name + "' carries " +
                      (cuda ? "CUDA" : "CPU") + " tensors");
    }
  }
  // A transport that holds the object itself (two-sided) names where it sends from before the
  // data exists: published at reserve too.
  const bool publish_now = !reserved || t.traits().holds_itself;
  uint64_t id;
  uint32_t slot, generation;
  {
    std::lock_guard<std::mutex> lock(mutex);
    slot = take_slot_locked();
    id = next_id++;
    generation = slots.slot(slot).generation.load() + 1;
    slots.slot(slot).generation.store(generation);
    Object& o = objects[id];
    o.id = id;
    o.slot = slot;
    o.generation = generation;
    o.metas = metas;
    o.transport = name;
    o.t = &t;
    o.expected_gets = opts.expected_gets;
    o.keep_for = opts.keep_for;
    o.check_writes = opts.check_writes || check_writes_env;
    o.handles = 1;  // the pin made below: nothing frees it meanwhile
  }
  Publication pub;
  std::vector<TensorView> published = tensors;
  std::vector<std::shared_ptr<void>> storage;
  if (publish_now) {
    try {
      if (opts.snapshot && !reserved) published = snapshot_copy(t, tensors, storage);
      // A two-sided ref names its group even before the data exists.
      pub = t.publish(PublishRequest{ObjectId{id, generation, slot}, published, opts.stream});
      if (pub.blob.size() > TensorRef::kMaxBlob) {
        t.unpublish(ObjectId{id, generation, slot});
        throw Error(ErrorCode::kInvalidArgument,
                    "put on " + who() + ": transport '" + name + "' describes these " +
                        std::to_string(tensors.size()) + " tensors in " +
                        std::to_string(pub.blob.size()) + " bytes, a ref holds at most " +
                        std::to_string(TensorRef::kMaxBlob) + " (put fewer tensors per object)");
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      objects.erase(id);
      free_slots.push_back(slot);
      throw;
    }
  }
  TensorRef ref(identity, ObjectId{id, generation, slot}, name, metas, pub.places, pub.blob,
                !t.traits().one_sided && name != "socket", reserved);
  if (!options.secret.empty()) ref.sign(options.secret);
  {
    std::lock_guard<std::mutex> lock(mutex);
    Object& o = objects.at(id);
    o.ref = ref;
    o.publication = pub;
    o.published = !reserved;
    o.snapshot = opts.snapshot;
    if (!reserved) {
      o.tensors = std::move(published);
      o.storage = std::move(storage);
      if (o.check_writes) o.crcs = checksums(o.tensors);
    }
    o.state = reserved ? kSlotReserved : kSlotLive;
    Slot& s = slots.slot(slot);
    s.flags.store(opts.expected_gets > 0 ? kSlotCountsGets : 0);
    s.state.store(o.state);
  }
  auto pin = std::make_shared<ObjectPin>();
  pin->core = weak_from_this();
  pin->id = id;
  pin->ref = ref;
  return ObjectHandle(std::move(pin));
}

void AgentCore::fulfil(uint64_t id, const std::vector<TensorView>& tensors) {
  Object* o = nullptr;
  std::string name;
  uint32_t generation, slot;
  bool snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = objects.find(id);
    if (it == objects.end() || it->second.state != kSlotReserved || it->second.fulfilling) {
      throw Error(ErrorCode::kInvalidUsage,
                  "fulfil on " + who() + ": object " + std::to_string(id) +
                      (it == objects.end()     ? " is gone"
                       : it->second.fulfilling ? " is being fulfilled by another call"
                                               : " is not reserved (fulfilled or failed)"));
    }
    o = &it->second;
    if (tensors.size() != o->metas.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "fulfil on " + who() + ": object " + std::to_string(id) + " has " +
                      std::to_string(o->metas.size()) + " tensors, got " +
                      std::to_string(tensors.size()));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorMeta& m = o->metas[i];
      if (tensors[i].dtype() != m.dtype || tensors[i].shape() != m.shape ||
          tensors[i].device() != m.device) {
        throw Error(ErrorCode::kInvalidArgument, "fulfil on " + who() + ": tensor " +
                                                     std::to_string(i) + " is " + tensors[i].str() +
                                                     ", object " + std::to_string(id) +
                                                     " reserved " + m.str());
      }
    }
    name = o->transport;
    generation = o->generation;
    slot = o->slot;
    snapshot = o->snapshot;
    o->fulfilling = true;  // one fulfil at a time: a second one is refused above
  }
  TensorTransport& t = transport(name);
  std::vector<std::shared_ptr<void>> storage;
  std::vector<TensorView> published;
  Publication pub;
  try {
    published = snapshot ? snapshot_copy(t, tensors, storage) : tensors;
    pub = t.publish(PublishRequest{ObjectId{id, generation, slot}, published});
    if (pub.blob.size() > TensorRef::kMaxBlob) {
      t.unpublish(ObjectId{id, generation, slot});
      throw Error(ErrorCode::kInvalidArgument,
                  "fulfil on " + who() + ": transport '" + name + "' describes these tensors in " +
                      std::to_string(pub.blob.size()) + " bytes, a ref holds at most " +
                      std::to_string(TensorRef::kMaxBlob));
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = objects.find(id);
    if (it != objects.end()) it->second.fulfilling = false;
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end() || it->second.state != kSlotReserved) {
    t.unpublish(ObjectId{id, generation, slot});
    throw Error(ErrorCode::kInvalidUsage,
                "fulfil on " + who() + ": object " + std::to_string(id) + " went meanwhile");
  }
  it->second.fulfilling = false;
  it->second.publication = pub;
  it->second.published = true;
  it->second.tensors = published;
  if (it->second.check_writes) it->second.crcs = checksums(published);
  it->second.storage = std::move(storage);
  it->second.state = kSlotLive;
  slots.slot(it->second.slot).state.store(kSlotLive);
  changed.notify_all();
}

void AgentCore::fail(uint64_t id, std::string_view message) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end()) {
    throw Error(ErrorCode::kInvalidUsage,
                "fail on " + who() + ": object " + std::to_string(id) + " is gone");
  }
  Object& o = it->second;
  if (o.state == kSlotRetiring) return;
  o.failure = std::string(message);
  o.state = kSlotFailed;
  slots.slot(o.slot).state.store(kSlotFailed);
  changed.notify_all();
}

void AgentCore::drop_pin(uint64_t id) {
  if (forked()) return;  // the parent's object
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end()) return;
  Object& o = it->second;
  if (--o.handles > 0) return;
  o.keep_until = deadline_after(o.keep_for);
  settle_locked(o);
  changed.notify_all();  // the housekeeper may have a keep_for deadline to watch
}

bool AgentCore::leased_by_a_lane_locked(const Object& o, std::string* holder) const {
  for (const auto& [uuid, c] : consumers) {
    if (c->lane && c->lane->holds(o.slot, o.generation)) {
      if (holder != nullptr) {
        *holder = "agent '" + c->identity.name + "' (pid " + std::to_string(c->identity.pid) + ")";
      }
      return true;
    }
  }
  return false;
}

void AgentCore::settle_locked(Object& o) {
  if (o.state != kSlotRetiring && o.handles == 0 && o.expected_gets == 0 &&
      Clock::now() >= o.keep_until) {
    o.state = kSlotRetiring;
    slots.slot(o.slot).state.store(kSlotRetiring);  // seq_cst: then look at the lanes
    changed.notify_all();
  }
  if (o.state == kSlotRetiring && o.local_leases == 0 && !leased_by_a_lane_locked(o)) {
    free_locked(objects.find(o.id));
  }
}

void AgentCore::settle_all_locked() {
  std::vector<uint64_t> ids;
  for (const auto& [id, o] : objects) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = objects.find(id);
    if (it != objects.end()) settle_locked(it->second);
  }
}

void AgentCore::free_locked(std::map<uint64_t, Object>::iterator it) {
  Object& o = it->second;
  check_writes_locked(o);
  if (o.published) o.t->unpublish(ObjectId{o.id, o.generation, o.slot});
  for (auto& [name, also] : o.also) also.first->unpublish(ObjectId{o.id, o.generation, o.slot});
  slots.slot(o.slot).state.store(kSlotFree);
  free_slots.push_back(o.slot);
  freed.emplace_back(o.id, Clock::now());
  if (freed.size() > 4096) freed.pop_front();
  objects.erase(it);
  changed.notify_all();
}

std::string AgentCore::freed_text_locked(uint64_t id) const {
  for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
    if (it->first == id) return "was freed " + seconds_ago(it->second) + " ago";
  }
  return id < next_id ? "was freed" : "was never published by this agent";
}

Object& AgentCore::find_locked(uint64_t id, uint32_t gen) {
  auto it = objects.find(id);
  if (it == objects.end() || it->second.generation != gen) {
    throw Error(ErrorCode::kInvalidUsage,
                "object " + std::to_string(id) + " " + freed_text_locked(id) + " at its owner");
  }
  return it->second;
}

void AgentCore::await_fulfilled_locked(std::unique_lock<std::mutex>& lock, uint64_t id,
                                       uint32_t gen, Clock::time_point deadline,
                                       const std::function<void()>& each_slice) {
  auto ready = [&] {
    auto it = objects.find(id);
    return stopping || it == objects.end() || it->second.generation != gen ||
           it->second.state != kSlotReserved;
  };
  while (!ready() && Clock::now() < deadline) {
    changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
    if (each_slice) each_slice();
  }
}

std::vector<TensorView> AgentCore::hold(uint64_t id, uint32_t gen, Clock::time_point deadline,
                                        const TensorTransport* on,
                                        const std::function<void()>& each_slice) {
  std::unique_lock<std::mutex> lock(mutex);
  await_fulfilled_locked(lock, id, gen, deadline, each_slice);
  Object& o = find_locked(id, gen);
  require_live(o);
  if (on != nullptr && o.t != on) {
    throw Error(ErrorCode::kInvalidArgument,
                "object " + std::to_string(id) + " was published on '" + o.transport + "'");
  }
  ++o.local_leases;
  return o.tensors;
}

void AgentCore::release_hold(uint64_t id, bool counted) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end()) return;
  --it->second.local_leases;
  if (counted) count_get_locked(it->second);
  settle_locked(it->second);
}

HeldObject AgentCore::hold_for(const TensorTransport& t, ObjectId object,
                               Clock::time_point deadline) {
  HeldObject held;
  held.tensors = hold(object.id, object.generation, deadline, &t);
  std::weak_ptr<AgentCore> weak = weak_from_this();
  auto once = std::make_shared<std::atomic<bool>>(false);
  held.release = [weak, id = object.id, once](bool completed) {
    if (once->exchange(true)) return;  // exactly once, whatever the transport does
    if (auto self = weak.lock(); self && !self->forked()) self->release_hold(id, completed);
  };
  return held;
}

void AgentCore::count_get_locked(Object& o) {
  if (o.expected_gets > 0 && --o.expected_gets == 0) slots.slot(o.slot).flags.store(0);
}

}  // namespace tutti::detail
