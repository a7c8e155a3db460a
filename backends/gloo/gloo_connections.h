// GlooConnections: the sockets of one Gloo context, found so that an abort can end them and so
// that a peer's abort is noticed at once (internal to the Gloo backend).
//
// Gloo 0.5 offers no way to interrupt an op waiting inside its collectives, and Pair::close()
// does not wake them. Resetting a pair's connection does: Gloo's event loop sees the error,
// signals every buffer waiting on that pair, and the op throws at once. Gloo's pairs each listen
// on their own address and publish it through the rendezvous store; a socket is this context's
// when its local address is one of this rank's pair addresses, or its peer's address is one a
// peer's pair published for this rank. The sockets are looked up in /proc/self/fd once, after
// the context connects, and duplicated, so they stay valid (and watched) whatever Gloo closes.
//
// An abort resets every connection (RST: a connect to AF_UNSPEC, then a shutdown that wakes
// Gloo's loop here), which the peer sees at once, even behind unread data. A watcher thread waits for such a reset on any connection and then
// aborts this rank too, so an abort reaches every rank, including those waiting on a third. A
// plain close (a peer that destroyed its group after its last op, or one whose process died) is
// no reset: Gloo itself fails an op that still needs that peer, whose abort then resets the rest.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tutti::gloo_backend {

class GlooConnections {
 public:
  GlooConnections() = default;
  ~GlooConnections();
  GlooConnections(const GlooConnections&) = delete;
  GlooConnections& operator=(const GlooConnections&) = delete;

  // What connectFullMesh wrote or read under the key of rank `r`: the listening addresses of
  // r's pairs, one per other rank.
  void record(int r, const std::vector<char>& addresses);
  // Looks up this context's sockets (call once connected).
  void find(int rank, int world_size);
  // Calls on_reset(rank) (once, from the watcher thread) when the connection to `rank` is reset.
  void watch(std::function<void(int rank)> on_reset);
  // Ends the watcher (joins it). Idempotent.
  void stop_watching();
  // Resets every connection. Safe from any thread, repeatedly (only the first call acts).
  void reset_all();
  // The rank whose address (as Gloo prints it in its errors) `message` names, or -1.
  int rank_in(const std::string& message) const;
  size_t size() const;

 private:
  struct Socket {
    int fd;    // our duplicate
    int rank;  // the peer at the other end
  };
  void watch_loop(int stop_fd, const std::function<void(int rank)>& on_reset);

  mutable std::mutex mutex_;
  std::map<int, std::vector<char>> published_;  // by rank
  std::vector<Socket> sockets_;
  std::map<std::string, int> gloo_names_;  // each peer's addresses, as Gloo prints them
  bool reset_ = false;
  int stop_fd_ = -1;  // an eventfd that ends the watcher
  std::thread watcher_;
};

}  // namespace tutti::gloo_backend
