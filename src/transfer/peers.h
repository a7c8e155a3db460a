// The consumer's side of the agents' connections: the owners it gets from (Peer, agent_core.h),
// a pool of connections to each, and PeerLink, one get's line to its owner (internal to the
// direct transport).
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transfer/agent_core.h"
#include "transfer/handshake.h"  // owner_text

namespace tutti::detail {

// Whether the owner's process still runs (one host only: the pid and its start time).
bool owner_alive(const AgentIdentity& owner);
// Prefixes an error from below with what this get was, keeping its code.
[[noreturn]] void rethrow_with(const std::string& context, const Error& e);
// As rethrow_with; a kIoError from a broken connection to an owner on this host whose process
// is what went says so (the owner died), keeping the transport's words after it.
[[noreturn]] void rethrow_io(const std::string& context, const AgentIdentity& owner,
                             const AgentIdentity& me, const Error& e);

// The consumer's line to one owner for one get (TransportPeer for the transports): each request
// takes a pooled connection and gives it back after the reply.
class PeerLink final : public TransportPeer {
 public:
  PeerLink(AgentCore& core, std::shared_ptr<Peer> peer, Clock::time_point deadline,
           const std::atomic<bool>* cancelled, ObjectId object)
      : core_(core),
        peer_(std::move(peer)),
        deadline_(deadline),
        cancelled_(cancelled),
        object_(object) {}

  // A kept connection goes back to the pool with the link.
  ~PeerLink() override;
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  const AgentIdentity& owner() const override { return peer_->owner; }

  // One request, one reply: kError replies are rethrown with the owner's code.
  Message request(MsgType type, const std::string& payload, const std::vector<int>& fds = {});

  std::string call(const std::string& request_bytes, std::vector<int>* fds) override;
  std::string call_with(const std::function<std::string()>& make, std::vector<int>* fds,
                        bool* replied) override;
  void stream(const std::vector<TensorView>& into) override;

  void set_transport(std::string name) { transport_name_ = std::move(name); }
  // Whether the owner counts a completed stream as one of the object's expected gets: the
  // socket path does; a transport streaming inside a lease does not (ending the lease counts).
  void set_stream_counts(bool counts) { stream_counts_ = counts; }
  // Calls keep their connection until the link goes, not only until the reply: for a transport
  // whose owner goes on serving the get after its reply (a two-sided send runs on the thread
  // that serves the connection), so that no other request of this agent's waits behind it. A
  // link that goes by an exception closes it (the owner may still be sending). The cost: each
  // concurrent get of such a transport holds a connection (past the pool's cap, a new one is
  // made and closed after). Calls of one link from one thread at a time (one fetch's).
  void keep_connection() { keep_ = true; }

 private:
  // As request(), the payload made once a pooled or new connection is up.
  // `replied` (when given) is set once the reply came.
  Message round_trip(MsgType type, const std::function<std::string()>& make,
                     const std::vector<int>& fds, bool* replied = nullptr);

  AgentCore& core_;
  std::shared_ptr<Peer> peer_;
  Clock::time_point deadline_;
  const std::atomic<bool>* cancelled_;
  ObjectId object_;
  std::string transport_name_;
  bool stream_counts_ = false;
  bool keep_ = false;
  std::unique_ptr<Connection> kept_;
  const int unwinding_ = std::uncaught_exceptions();  // at the link's making
};

}  // namespace tutti::detail
