// GroupTransport's own protocol: both halves of a two-sided fetch (gloo, nccl), over the agents'
// TransportPeer::call and TensorTransport::answer like any transport's. The consumer numbers the
// transfer in its pair's sequence when it leads the pair and asks the owner; the owner holds the
// object (TransportOwner), queues its send on the transport's group (or leaves it for its serving
// thread to run after the reply: AnswerRequest::then) and grants the number; the consumer queues
// the matching receive and waits (group_transport.h).
#include "transfer/group_transport.h"
#include "transfer/handshake.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// The owner's answer: a status, never an error reply, so that the consumer knows whether its
// number was used up.
enum FetchStatus : uint8_t {
  kGranted = 0,        // + the pair's number of the send
  kRefusedSeen = 1,    // + the error; the owner skips the consumer's number
  kRefusedUnseen = 2,  // + the error; the owner never looked at the number
};

}  // namespace

Reach GroupTransport::reach(const TensorRef& ref, const AgentIdentity&) const {
  bool member = false;
  check_member(ref, &member);  // kAborted for a member while the group is aborted
  if (member) return {};
  Reach r;
  r.direct = false;
  r.code = ErrorCode::kInvalidUsage;
  try {
    check_member(ref, nullptr);  // throws, naming the group and the fix
  } catch (const Error& e) {
    r.why = e.what();
  }
  return r;
}

FetchResult GroupTransport::fetch(const FetchRequest& request) {
  const TensorRef& ref = request.ref;
  const int owner_rank = check_member(ref, nullptr);
  const ObjectId object = ref.object();
  const std::string owner_id = ref.owner().uuid_text();
  const std::string owner = owner_text(ref.owner()) + " (rank " + std::to_string(owner_rank) + ")";
  uint64_t seq = 0;  // this rank's number for the transfer, when it leads the pair
  uint64_t incarnation = 0;
  bool made = false;     // the request was made (and may have reached the owner)
  bool replied = false;  // the owner's reply came (an error reply: it numbered nothing)
  std::string reply;
  try {
    reply = request.owner.call_with(
        [&] {
          seq = lead(owner_rank, owner_id, &incarnation);
          made = true;
          WireWriter w;
          w.u64(object.id);
          w.u32(object.generation);
          w.u64(wire_timeout(request.deadline));
          w.str8(set());
          w.u64(incarnation);
          w.u32(static_cast<uint32_t>(rank()));
          w.u64(seq);
          return std::move(w.out());
        },
        nullptr, &replied);
  } catch (const Error& e) {
    // Out of step: this side's number never reached the owner, or the owner may have numbered
    // (and queued) the transfer without this side learning the number. An error reply before
    // any numbering (the owner has no such transport, the request did not parse) leaves the
    // pair as it was when this side took no number.
    if (seq > 0 || (made && !replied)) {
      abort("a fetch from " + owner + " broke off: " + e.what());
    }
    throw;
  }
  WireReader rd(reply, "a fetch grant from " + owner);
  const uint8_t status = rd.u8("status");
  if (status != kGranted) {
    const std::string error = rd.str32("error", 1u << 20);
    if (seq > 0 && status == kRefusedSeen) skip(owner_rank, owner_id, seq, incarnation);
    if (seq > 0 && status != kRefusedSeen) abort("the owner refused a fetch before it numbered it");
    throw_error_payload(error);
  }
  const uint64_t granted = rd.u64("number");
  receive(owner_rank, owner_id, granted, incarnation, request.targets, request.deadline,
          request.cancelled, owner);
  return {};
}

std::string GroupTransport::answer_with(const AnswerRequest& request) {
  const std::string consumer_id = request.consumer.uuid_text();
  WireReader r(request.request, "a two-sided fetch");
  const uint64_t id = r.u64("id");
  const uint32_t gen = r.u32("generation");
  // At most a day, as every wait a consumer asks for (a larger one overflowed the clock's sum:
  // found by fuzzing). A reservation not fulfilled in time is refused a little before the
  // consumer gives up, so that the refusal reaches it (a consumer that gives up first must abort
  // the group).
  const uint64_t timeout = r.u64("timeout");
  const auto deadline = wire_deadline(timeout);
  const auto wait_deadline = wire_answer_deadline(timeout);
  const std::string set = r.str8("group set");
  const uint64_t incarnation = r.u64("incarnation");
  const int rank = static_cast<int>(r.u32("rank"));
  const uint64_t seq = r.u64("seq");
  WireWriter w;
  bool seen = false;  // the consumer's number is this side's to skip on a refusal
  try {
    check_peer(set, incarnation, rank, wait_deadline);
    seen = true;
    HeldObject held = request.owner.hold(ObjectId{id, gen, 0}, wait_deadline);
    // The hold lasts until the send is done (or failed).
    uint64_t number = 0;
    try {
      number = send(rank, consumer_id, seq, incarnation, std::move(held.tensors), deadline,
                    held.release, request.then);
    } catch (...) {
      held.release(false);
      throw;
    }
    w.u8(kGranted);
    w.u64(number);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kIoError) throw;
    if (seen && seq > 0) skip(rank, consumer_id, seq, incarnation);
    TUTTI_LOG_DEBUG(
        "direct transport: agent '{}' refuses a two-sided fetch of object {} by "
        "agent '{}': {}",
        agent_, id, request.consumer.name, e.what());
    w = WireWriter();
    w.u8(seen ? kRefusedSeen : kRefusedUnseen);
    w.str32(error_payload(e));
  }
  return std::move(w.out());
}

}  // namespace tutti::detail
