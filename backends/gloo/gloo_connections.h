// GlooConnections: the sockets of one Gloo context, found so that an abort can end them
// (internal to the Gloo backend).
//
// Gloo 0.5 offers no way to interrupt an op waiting inside its collectives, and Pair::close()
// does not wake them. Resetting a pair's connection does: Gloo's event loop sees the error,
// signals every buffer waiting on that pair, and the op throws at once. Gloo's pairs each listen
// on their own address and publish it through the rendezvous store; a socket is this context's
// when its local address is that of one of this rank's pairs that accepted, or its peer's address
// is the one a peer's pair that accepted published for this rank (a pair that connected gave its
// address up, and another socket may hold it by then). The sockets are looked up in /proc/self/fd
// once, after the context connects, and remembered with their inode so that a reused descriptor is
// never touched.
//
// An abort resets every connection (RST: a connect to AF_UNSPEC, then a shutdown that wakes
// Gloo's loop here), which the peer sees at once, even behind unread data: a peer waiting on
// this rank fails at once, aborts in turn and resets its own connections, and so on. A peer
// waiting only on a third rank that is merely late learns of it when it next needs an aborted
// rank, or at its timeout. (A reset cannot be told from the one a peer that closed normally sends
// back to a late write, so it is not taken as an abort signal by itself.)
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tutti::gloo_backend {

class GlooConnections {
 public:
  GlooConnections() = default;
  GlooConnections(const GlooConnections&) = delete;
  GlooConnections& operator=(const GlooConnections&) = delete;

  // What connectFullMesh wrote or read under the key of rank `r`: the listening addresses of
  // r's pairs, one per other rank.
  void record(int r, const std::vector<char>& addresses);
  // Looks up this context's sockets (call once connected).
  void find(int rank, int world_size);
  // Resets every connection. Safe from any thread, repeatedly (only the first call acts).
  void reset_all();
  // The rank whose address (as Gloo prints it in its errors) `message` names, or -1.
  int rank_in(const std::string& message) const;
  // The descriptor of the connection to `peer` (Gloo's, for polling only), or -1 when none was
  // found.
  int socket_for(int peer) const;
  size_t size() const;

 private:
  struct Socket {
    int fd;
    unsigned long inode;
    int peer;
  };
  bool still_ours(const Socket& s) const;

  mutable std::mutex mutex_;
  std::map<int, std::vector<char>> published_;  // by rank
  std::vector<Socket> sockets_;
  std::map<std::string, int> gloo_names_;  // each peer's addresses, as Gloo prints them
  bool reset_ = false;
};

}  // namespace tutti::gloo_backend
