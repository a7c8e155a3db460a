// GlooConnections: the sockets of one Gloo context, found so that abort() can shut them down
// (internal to the Gloo backend).
//
// Gloo 0.5 offers no way to interrupt an op waiting inside its collectives, and Pair::close()
// does not wake them. Shutting a pair's socket down does: Gloo's event loop sees the connection
// end, signals every buffer waiting on that pair, and the op throws at once (so do the peer's,
// which learn of the abort the same way). Gloo's pairs each listen on their own address and
// publish it through the rendezvous store; a socket is this context's when its local address
// is one of this rank's pair addresses, or its peer's address is one a peer's pair published for
// this rank. The sockets are looked up in /proc/self/fd once, after the context connects, and
// remembered with their inode so that a reused descriptor is never touched.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tutti::gloo_backend {

class GlooConnections {
 public:
  // What connectFullMesh wrote or read under the key of rank `r`: the listening addresses of
  // r's pairs, one per other rank.
  void record(int r, const std::vector<char>& addresses);
  // Looks up this context's sockets (call once connected).
  void find(int rank, int world_size);
  // Shuts every remembered socket down (both directions). Safe from any thread, repeatedly.
  void shutdown_all();
  // The rank whose pair address (as Gloo prints it in its errors) `message` names, or -1.
  int rank_in(const std::string& message) const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, std::vector<char>> published_;  // by rank
  std::vector<std::pair<int, unsigned long>> sockets_;  // (fd, inode)
  std::map<std::string, int> gloo_names_;  // each peer's pair address, as Gloo prints it
};

}  // namespace tutti::gloo_backend
