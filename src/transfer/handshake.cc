// The hello between two agents, both halves (handshake.h).
#include "transfer/handshake.h"

#include <unistd.h>

#include "transfer/wire.h"
#include "util/crypto.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// Descriptors that came with a message: closed unless taken.
struct ReceivedFds {
  std::vector<int> fds;
  explicit ReceivedFds(std::vector<int>& from) : fds(std::move(from)) { from.clear(); }
  ~ReceivedFds() {
    for (int f : fds) ::close(f);
  }
  std::vector<int> take() { return std::move(fds); }
};

}  // namespace

std::string owner_text(const AgentIdentity& owner) {
  return "agent '" + owner.name + "' (pid " + std::to_string(owner.pid) + ")";
}

std::string encode_identity(const AgentIdentity& id) {
  WireWriter w;
  w.bytes(id.uuid.data(), 16);
  w.bytes(id.host_key.data(), 16);
  w.u32(id.pid);
  w.u64(id.start_time);
  w.str8(id.tcp_endpoint);
  w.str8(id.name);
  return std::move(w.out());
}

AgentIdentity decode_identity(const std::string& bytes) {
  WireReader r(bytes, "an agent's identity");
  AgentIdentity id;
  r.bytes(id.uuid.data(), 16, "id");
  r.bytes(id.host_key.data(), 16, "host key");
  id.pid = r.u32("pid");
  id.start_time = r.u64("start time");
  id.tcp_endpoint = r.str8("endpoint");
  id.name = r.str8("name");
  return id;
}

std::string hello_proof(const std::string& secret, const char* role, const AgentIdentity& owner,
                        const AgentIdentity& consumer, const std::string& owner_nonce,
                        const std::string& consumer_nonce) {
  WireWriter w;
  w.str8(std::string("tutti-rdt-hello/") + role);
  w.str8(owner.uuid_text());
  w.str8(consumer.uuid_text());
  w.str8(owner_nonce);
  w.str8(consumer_nonce);
  const auto mac = hmac_sha256(secret, w.out());
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::vector<int> offer_hello(Connection& conn, const HelloOffer& offer, Clock::time_point deadline,
                             const std::atomic<bool>* cancelled) {
  const AgentIdentity& owner = offer.owner;
  const std::string my_nonce = random_bytes(kHelloNonceBytes);
  WireWriter w;
  w.str32(encode_identity(offer.me));
  w.str32("");  // protocol 1's proof: an owner of that build reads on to the version
  w.u32(kProtocolVersion);
  w.str8(my_nonce);
  std::vector<int> lane;
  if (offer.local && offer.lane_fd >= 0) lane.push_back(offer.lane_fd);
  conn.send(MsgType::kHello, w.out(), lane, deadline, cancelled);
  Message m = conn.receive(deadline, cancelled);
  std::string their_nonce;      // the owner's, when it has a secret
  bool proved_nothing = false;  // challenged without a secret: the owner refuses
  if (m.type == MsgType::kChallenge) {
    proved_nothing = offer.secret.empty();
    ReceivedFds stray(m.fds);
    WireReader r(m.payload, "the hello's challenge from " + owner_text(owner));
    their_nonce = r.str8("nonce");
    // Without a secret the proof is empty: the owner refuses it, naming the secret.
    WireWriter p;
    p.str8(offer.secret.empty()
               ? std::string()
               : hello_proof(offer.secret, "consumer", owner, offer.me, their_nonce, my_nonce));
    conn.send(MsgType::kProof, p.out(), {}, deadline, cancelled);
    m = conn.receive(deadline, cancelled);
  }
  ReceivedFds fds(m.fds);
  if (m.type == MsgType::kError && proved_nothing) {
    try {
      throw_error_payload(m.payload);
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) +
                                " (this agent has no secret: give it the owner's when it is made, "
                                "TransferAgentOptions::secret or TUTTI_TRANSFER_SECRET)");
    }
  }
  if (m.type == MsgType::kError) throw_error_payload(m.payload);
  WireReader r(m.payload, "the hello's reply from " + owner_text(owner));
  const AgentIdentity them = decode_identity(r.str32("identity", 4096));
  const uint32_t version = r.u32("protocol version");
  if (version != kProtocolVersion) {
    throw Error(ErrorCode::kInvalidUsage,
                owner_text(owner) + " speaks the direct transport's protocol " +
                    std::to_string(version) + ", this agent " + std::to_string(kProtocolVersion) +
                    " (different tutti versions)");
  }
  const std::string their_proof = r.str8("proof");
  if (them.uuid != owner.uuid) {
    throw Error(ErrorCode::kIoError, "a different agent ('" + them.name + "') answers at " +
                                         owner_text(owner) + "'s address");
  }
  // With a secret, the owner must prove it over this connection's nonces: whoever answers at
  // the owner's address without it is not the owner.
  if (!offer.secret.empty() &&
      !same_secret(their_proof,
                   hello_proof(offer.secret, "owner", owner, offer.me, their_nonce, my_nonce))) {
    throw Error(ErrorCode::kInvalidArgument,
                "whoever answers at " + owner_text(owner) +
                    "'s address does not prove the shared secret (the owner has none, or another "
                    "one)");
  }
  // On one host the kernel says which process answers: the ref's pid must be it (cross-memory
  // reads go to that pid).
  if (offer.local && conn.peer_pid() != static_cast<long>(owner.pid)) {
    throw Error(ErrorCode::kInvalidArgument, owner_text(owner) + " answers from pid " +
                                                 std::to_string(conn.peer_pid()) +
                                                 ": the ref names another process");
  }
  return fds.take();
}

namespace {

// With a secret: the challenge, and the consumer's proof read back (empty when none came in
// time, or another message did).
std::string challenge(Connection& conn, const std::string& consumer_name,
                      const std::string& owner_nonce, std::chrono::milliseconds timeout) {
  WireWriter c;
  c.str8(owner_nonce);
  try {
    conn.send(MsgType::kChallenge, c.out(), {}, deadline_after(timeout));
  } catch (const Error& e) {
    throw Error(ErrorCode::kIoError,
                "hung up: the challenge to agent '" + consumer_name + "' did not go: " + e.what());
  }
  try {
    Message p = conn.receive(deadline_after(timeout));
    ReceivedFds stray(p.fds);
    if (p.type != MsgType::kProof) return "";
    WireReader pr(p.payload, "a hello's proof");
    return pr.str8("proof");
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kIoError) throw;  // the consumer went
    return "";
  }
}

}  // namespace

HelloAccepted accept_hello(Connection& conn, Message& hello, const AgentIdentity& me,
                           const std::string& secret, bool local,
                           std::chrono::milliseconds timeout) {
  ReceivedFds fds(hello.fds);
  const std::string who = "agent '" + me.name + "'";
  WireReader r(hello.payload, "a request to " + who);
  HelloAccepted out;
  out.consumer = decode_identity(r.str32("identity", 4096));
  r.str32("proof", 64);  // protocol 1's proof; empty from protocol 2 on
  // A hello from before versions ends after the proof: protocol 0.
  const uint32_t version = r.left() >= 4 ? r.u32("protocol version") : 0;
  if (version == kProtocolVersion) out.consumer_nonce = r.str8("nonce");
  const AgentIdentity& them = out.consumer;
  std::string refused;
  if (version != kProtocolVersion) {
    refused = "hello to " + who + ": agent '" + them.name +
              "' speaks the direct transport's protocol " + std::to_string(version) +
              ", this agent " + std::to_string(kProtocolVersion) + " (different tutti versions)";
  }
  if (refused.empty() && !secret.empty()) {
    // A proof over a nonce of this connection's own: one seen on another connection (read off
    // the wire) is worth nothing here.
    out.owner_nonce = random_bytes(kHelloNonceBytes);
    const std::string proof = challenge(conn, them.name, out.owner_nonce, timeout);
    if (!same_secret(proof, hello_proof(secret, "consumer", me, them, out.owner_nonce,
                                        out.consumer_nonce))) {
      refused = "hello to " + who + ": agent '" + them.name + "' does not know the shared secret";
    }
  }
  if (refused.empty() && local && conn.peer_pid() != static_cast<long>(them.pid)) {
    refused = "hello to " + who + ": agent '" + them.name + "' says it is pid " +
              std::to_string(them.pid) + ", its socket is pid " + std::to_string(conn.peer_pid());
  }
  if (!refused.empty()) {
    const Error e(ErrorCode::kInvalidArgument, refused);
    conn.send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(1));
    TUTTI_LOG_WARN("direct transport: {}", refused);
    throw Error(ErrorCode::kIoError, "hung up: " + refused);  // ends the connection
  }
  std::vector<int> taken = fds.take();
  if (local && !taken.empty()) {
    out.lane_fd = taken[0];
    for (size_t i = 1; i < taken.size(); ++i) ::close(taken[i]);
  } else {
    for (int f : taken) ::close(f);
  }
  return out;
}

void answer_hello(Connection& conn, const HelloAccepted& accepted, const AgentIdentity& me,
                  const std::string& secret, const std::vector<int>& fds,
                  Clock::time_point deadline) {
  WireWriter answer;
  answer.str32(encode_identity(me));
  answer.u32(kProtocolVersion);
  // The owner proves the secret too: a consumer is not fooled by an impostor that took the
  // owner's address.
  answer.str8(secret.empty() ? std::string()
                             : hello_proof(secret, "owner", me, accepted.consumer,
                                           accepted.owner_nonce, accepted.consumer_nonce));
  conn.send(MsgType::kReply, answer.out(), fds, deadline);
}

}  // namespace tutti::detail
