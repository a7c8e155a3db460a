// DirectExchange: small allreduces and barriers in one round trip over Gloo pairs in
// synchronous mode (internal to the Gloo backend).
//
// Why: Gloo's function API moves even 8 bytes through its event-loop thread (the loop reads the
// socket, then wakes the waiting caller) and, for unbound buffers, a ready-to-receive handshake
// per message, several steps per ring: ~150-200 us for an 8-byte allreduce on loopback, where one
// TCP round trip costs ~15 us. Here every rank sends its whole input, with a small header, to
// every other rank and reduces what it receives itself, in rank order, so every rank computes
// bit-identical results. The pairs are Gloo's own, of a second Gloo context connected beside the
// group's: switched to Gloo's synchronous mode (setSync), the calling thread reads the socket
// itself, and no event-loop thread or condition variable stands between the data and the caller.
// Before it blocks, a wait polls the socket for a while (giving the core away with sched_yield
// at each turn, so a peer that shares the core runs), because a sleeping thread's wake-up costs
// tens of microseconds on a busy or virtualised host.
//
// Data goes in chunks of kChunkBytes, each chunk exchanged and reduced before the next. Each
// message: a header (the op's tag and byte count) and one chunk, into a chunk-sized receive
// buffer per peer. A peer whose header disagrees (another op, or another size) fails the op with
// kRemoteError naming it; the streams stay in step. Each rank writes at most one chunk and its
// header to each peer before it reads: that fits inside the window a receiver's socket
// advertises before anything is read (Linux: 64 KiB by default), so the blocking writes never
// wait for a reader. (With 64 KiB chunks, 4 ranks stalled ~90 ms per call on TCP's timers.)
//
// Every rank sends its data to every other, (n - 1) times the bytes a ring sends per rank, in
// one step instead of 2(n - 1): the backend uses it where that wins (gloo_backend.cc).
//
// Threads: one op at a time (the group's rule); reset() may come from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gloo_connections.h"
#include "tensor/reduction.h"
#include "tutti/op_type.h"
#include "tutti/store.h"

namespace gloo {
class Context;
namespace transport {
class Buffer;
class Device;
}  // namespace transport
}  // namespace gloo

namespace tutti::gloo_backend {

class DirectExchange {
 public:
  static constexpr size_t kChunkBytes = 32 << 10;

  // Connects a second Gloo context of the group over `store` (keys under "direct/"); every rank
  // constructs it at the same point. Throws gloo's exceptions (the caller translates them).
  DirectExchange(int rank, int world_size, const std::shared_ptr<tutti::Store>& store,
                 const std::shared_ptr<::gloo::transport::Device>& device,
                 std::chrono::milliseconds timeout);
  ~DirectExchange();

  // data = data_0 (fn) data_1 (fn) ... over the ranks, element-wise.
  void allreduce(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                 const OpContext& ctx);
  // Returns once every rank has entered the barrier.
  void barrier(const OpContext& ctx);

  // Resets every connection (abort): a waiting exchange here and on the peers ends at once.
  void reset() { connections_.reset_all(); }
  // The rank a Gloo error message names (an address of this context's pairs), or -1.
  int rank_in(const std::string& message) const { return connections_.rank_in(message); }

 private:
  // Sends this rank's header and `bytes` (<= kChunkBytes) of data to every peer, then receives
  // every peer's; `total` is the op's size, which the headers compare.
  void exchange(const void* data, size_t bytes, uint64_t total,
                std::chrono::steady_clock::time_point deadline, const OpContext& ctx);
  // Waits until the socket to `peer` has data to read: polls, then sleeps in poll().
  void wait_readable(int peer, std::chrono::steady_clock::time_point deadline,
                     const OpContext& ctx);

  int rank_;
  int world_size_;
  std::shared_ptr<::gloo::Context> context_;
  GlooConnections connections_;
  std::vector<char> outbox_;                 // header + this rank's data
  std::vector<std::vector<char>> inbox_;     // per rank (this rank's unused)
  std::vector<std::unique_ptr<::gloo::transport::Buffer>> send_;  // per rank
  std::vector<std::unique_ptr<::gloo::transport::Buffer>> recv_;  // per rank
};

}  // namespace tutti::gloo_backend
