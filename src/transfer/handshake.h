// The hello that opens every connection between two agents, both halves (internal to the direct
// transport). The consumer offers: its identity, the protocol version, a fresh nonce (and on one
// host its lease lane's descriptor). An owner with a secret answers with a challenge of its own
// nonce, and the consumer proves the secret over both; the owner's reply proves it back, with its
// identity and (on one host) its slot page's descriptor. Either side refuses a peer of another
// protocol version, one that does not know the secret, and on one host one whose socket belongs
// to another process than it claims.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "transfer/channel.h"
#include "tutti/tensor_ref.h"

namespace tutti::detail {

// "agent 'a' (pid 12)", for messages.
std::string owner_text(const AgentIdentity& owner);

// An agent's identity as the hello carries it.
std::string encode_identity(const AgentIdentity& id);
AgentIdentity decode_identity(const std::string& bytes);

// The hello's proofs of the shared secret: the consumer's ("consumer") and the owner's ("owner"),
// each an HMAC over its role, both agents' ids and both sides' fresh nonces, so that neither can
// be replayed on another connection or sent back as the other's.
std::string hello_proof(const std::string& secret, const char* role, const AgentIdentity& owner,
                        const AgentIdentity& consumer, const std::string& owner_nonce,
                        const std::string& consumer_nonce);

// ---- the consumer's half ----

struct HelloOffer {
  const AgentIdentity& me;
  const AgentIdentity& owner;  // the agent the ref names: whoever answers must be it
  const std::string& secret;   // empty: none
  bool local = false;          // a Unix socket on one host
  int lane_fd = -1;            // local: the consumer's lease lane, sent along
};

// Says hello on a new connection. Returns the descriptors the owner's reply carried (on one host
// its slot page first; the caller owns them). Throws the owner's refusal with its code, or
// kInvalidUsage (another protocol version), kInvalidArgument (the secret is not proved, the pid
// is not the ref's), kIoError (another agent answers).
std::vector<int> offer_hello(Connection& conn, const HelloOffer& offer, Clock::time_point deadline,
                             const std::atomic<bool>* cancelled);

// ---- the owner's half ----

struct HelloAccepted {
  AgentIdentity consumer;
  int lane_fd = -1;  // on one host, the consumer's lease lane (the caller owns it)
  std::string owner_nonce, consumer_nonce;
};

// Reads a consumer's hello (`hello`, received on `conn`), challenges it when `secret` is set and
// checks what it says. A refused consumer is told why and the call throws kIoError (the
// connection ends); descriptors that came with the hello are closed on every failure.
HelloAccepted accept_hello(Connection& conn, Message& hello, const AgentIdentity& me,
                           const std::string& secret, bool local,
                           std::chrono::milliseconds timeout);

// The owner's reply to an accepted hello: its identity, version and proof (+ `fds`).
void answer_hello(Connection& conn, const HelloAccepted& accepted, const AgentIdentity& me,
                  const std::string& secret, const std::vector<int>& fds,
                  Clock::time_point deadline);

}  // namespace tutti::detail
