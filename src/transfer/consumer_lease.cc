// The consumer's leases: a hold on the owner's object for the length of one get (a lane entry
// on one host, else the owner's own hold through kLease), ended exactly once (consumer.h).
#include "transfer/consumer.h"
#include "transfer/publication_wire.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {

AgentCore::Lease AgentCore::take_lease(Resolved& r, PeerLink& link, Clock::time_point deadline,
                                       const std::atomic<bool>& cancelled) {
  const ObjectId object = r.ref.object();
  const auto owner_gone = [&] {
    throw Error(ErrorCode::kIoError,
                owner_text(r.ref.owner()) + " is gone (its process exited or died)");
  };
  bool waited = false;
  while (true) {
    if (cancelled.load()) throw Error(ErrorCode::kAborted, "cancelled");
    uint32_t state = kSlotFree;
    if (r.local && r.transport->traits().one_sided) {
      // Read under the peer's lock: another get's first connection may be setting it.
      SlotView* slot_page = r.peer->slot_view();
      if (slot_page == nullptr) {
        // The first connection brings the owner's slot page.
        auto conn = checkout(*r.peer, deadline, &cancelled);
        checkin(*r.peer, std::move(conn));
        slot_page = r.peer->slot_view();
      }
      if (slot_page != nullptr && !r.ref.is_pending()) {
        const int entry = r.peer->lane->acquire(*slot_page, object.slot, object.generation, state);
        if (entry >= 0) {
          if (!r.peer->owner_exited()) return Lease{entry, false};
          r.peer->lane->release(*slot_page, entry, object.slot);
          owner_gone();
        }
      } else {
        state = kSlotReserved;
      }
      // A dead owner's page still says what became of its objects, but once the housekeeping
      // has forgotten the owner (100-200 ms after) the next get finds its socket gone: every get
      // after the owner's death says so, whichever came first.
      if (r.peer->owner_exited()) owner_gone();
    } else {
      // No lane (another host, or a two-sided transport): the owner keeps the hold.
      WireWriter w;
      w.u64(object.id);
      w.u32(object.generation);
      if (!r.ref.is_pending()) {
        Message m = link.request(MsgType::kLease, w.out());
        WireReader rd(m.payload, "a lease reply");
        state = rd.u32("state");
        if (state == kSlotLive) return Lease{-1, true};
      } else {
        state = kSlotReserved;
      }
    }
    // Not live: ask the owner what it is (waiting for a reserved one to be fulfilled).
    if (state == kSlotFree) {
      throw Error(ErrorCode::kInvalidUsage,
                  "the object was freed at its owner (its handles "
                  "were released and its expected gets were done)");
    }
    if (state == kSlotRetiring) {
      throw Error(ErrorCode::kInvalidUsage,
                  "the object is being freed at its owner (no handle, expected get or keep_for "
                  "holds it)");
    }
    if (waited && state != kSlotReserved && state != kSlotFailed) {
      throw Error(ErrorCode::kInternal, "the object's state changed to " + std::to_string(state) +
                                            " after its owner said it was live");
    }
    WireWriter w;
    w.u64(object.id);
    w.u32(object.generation);
    w.u64(wire_timeout(deadline));
    Message m = link.request(MsgType::kWait, w.out());
    WireReader rd(m.payload, "a wait reply from " + owner_text(r.ref.owner()));
    const uint32_t now_state = rd.u32("state");
    if (now_state == kSlotFailed) {
      throw Error(ErrorCode::kRemoteError, "the owner failed it: " + rd.str32("message", 1u << 20));
    }
    if (now_state != kSlotLive) {
      throw Error(ErrorCode::kInvalidUsage, "the object is being freed at its owner");
    }
    if (r.ref.is_pending()) {
      const Publication pub = read_publication(rd, r.ref.tensors().size());
      r.ref = TensorRef(r.ref.owner(), object, r.ref.transport(), r.ref.tensors(), pub.places,
                        pub.blob, r.ref.is_two_sided(), false);
    }
    waited = true;
  }
}

void AgentCore::count_get(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease) {
  if (lease.entry >= 0 &&
      (peer.slot_view()->slot(object.slot).flags.load() & kSlotCountsGets) == 0) {
    return;
  }
  WireWriter w;
  w.u64(object.id);
  w.u32(object.generation);
  link.request(MsgType::kGot, w.out());
}

void AgentCore::end_lease(Peer& peer, PeerLink& link, ObjectId object, const Lease& lease,
                          bool completed) {
  // The hold ends first, whatever becomes of the messages after it; the count of expected gets
  // keeps the object until the owner has counted this one.
  if (lease.entry >= 0) {
    const SlotView* slots = peer.slot_view();
    const bool counts = completed && (slots->slot(object.slot).flags.load() & kSlotCountsGets) != 0;
    const bool owner_waits = peer.lane->release(*slots, lease.entry, object.slot);
    if (counts) {
      count_get(peer, link, object, Lease{-1, false});  // the owner settles the object on it
    } else if (owner_waits) {
      link.request(MsgType::kReleased, "");  // the owner waits on it: look again now
    }
  } else if (lease.remote) {
    WireWriter w;
    w.u64(object.id);
    w.u32(object.generation);
    link.request(MsgType::kUnlease, w.out());
    if (completed) count_get(peer, link, object, lease);
  }
}

LeaseGuard::LeaseGuard(AgentCore& core, const AgentCore::Resolved& r, AgentCore::Lease lease)
    : core_(core), r_(r), lease_(lease) {}

LeaseGuard::~LeaseGuard() {
  if (!held_) return;
  try {
    PeerLink link(core_, r_.peer, deadline_after(std::chrono::seconds(1)), nullptr,
                  r_.ref.object());
    core_.end_lease(*r_.peer, link, r_.ref.object(), lease_, false);
  } catch (const std::exception& e) {
    TUTTI_LOG_DEBUG("direct transport: giving back a lease on {}: {}", r_.ref.describe(), e.what());
  }
}

void LeaseGuard::complete(PeerLink& link) {
  held_ = false;
  core_.end_lease(*r_.peer, link, r_.ref.object(), lease_, true);
}

AgentCore::Lease LeaseGuard::release() {
  held_ = false;
  return lease_;
}

}  // namespace tutti::detail
