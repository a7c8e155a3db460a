// DirectExchange: the Gloo backend's collectives over the sockets of a second Gloo context,
// read and written by the calling thread (internal to the Gloo backend).
//
// Why: Gloo's function API moves even 8 bytes through its event-loop thread (the loop reads the
// socket, then wakes the waiting caller) and, for unbound buffers, a ready-to-receive handshake
// per message, several steps per ring: ~150-200 us for an 8-byte allreduce on loopback, where one
// TCP round trip costs ~15 us; and its ring moves each segment through the same loop, with a
// wake-up per segment. And it never wakes a send its socket has taken part of when the peer dies:
// such a rank waited out its op timeout. Here a second Gloo context is connected beside the
// group's (Gloo makes the connections, over the group's store), its pairs are switched to Gloo's
// synchronous mode (which takes their sockets out of the event loop), and this class then reads
// and writes those sockets itself, non-blocking: every transfer of a step (to every peer, both
// ways) advances together in one loop, so no write waits for a reader and no step can deadlock,
// whatever the sizes and the socket buffers.
//
// The allreduce's three algorithms:
// - direct: every rank sends its whole input, after a 16-byte header (the op's tag and size),
//   to every other rank and reduces what it receives itself, in rank order, so every rank
//   computes bit-identical results. One step; (n - 1) times a ring's bytes per rank. For small
//   and mid-size allreduces, and barriers (a header alone).
// - doubling (a power of two ranks): recursive doubling, log2(n) steps, each exchanging the whole
//   partial sum with one peer: fewer messages and bytes than direct from 4 ranks on.
// - ring: reduce-scatter then allgather over the ring of ranks, 2(n - 1) steps of 1/n of the
//   data each; every block is reduced once, along the ring, so every rank again ends with the
//   same bits. A received block is folded into the output as it arrives (through a small staging
//   buffer that stays in cache), not after the whole block is in.
// The other collectives, one step each but broadcast's chain: broadcast (the root sends to every
// rank; large messages down the chain of ranks, passed on as they come), reduce (every rank sends
// to the root; large messages at 3 ranks or more by the ring), allgather and reduce_scatter
// (every rank sends each peer its block: as many bytes as a ring, in one step). A rank that only
// sends in an op (a broadcast's root, a reduce's non-roots) takes a header back from each peer
// it sends to, so that ranks that disagree on the root do not all return: at 2 ranks both fail
// at once; at more, a rank that waits for a header that never comes fails at its timeout, and
// the stray bytes fail the next op on that connection (TUTTI_DEBUG=DETAIL checks roots first).
// Point-to-point messages travel the same connections, each pair's in order per direction: the
// group numbers them so, and each carries its tag in its header.
//
// A peer whose header disagrees (another op, size or algorithm) fails the op with kRemoteError
// naming it; the backend then aborts the group (the streams are out of step). Where the data goes
// straight into the caller's memory (broadcast, allgather), the header is read alone first, so a
// peer in another op never writes there. A peer that closes
// or resets its connection (it died, or aborted) fails the op at once with kIoError naming it.
// Before it sleeps in poll(), a wait polls its sockets for a while (TUTTI_GLOO_SPIN_US, default
// 200 us), giving the core away with sched_yield at each turn, because a sleeping thread's
// wake-up costs tens of microseconds on a busy or virtualised host.
//
// Threads: one op at a time (the group's rule); reset() may come from any thread.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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
class Device;
}  // namespace transport
}  // namespace gloo

namespace tutti::gloo_backend {

inline bool is_power_of_two(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

class DirectExchange {
 public:
  // The ring's staging buffer: what a received block passes through on its way into the output.
  static constexpr size_t kStagingBytes = 256 << 10;
  // The send buffer asked for on a connection to a rank of the same host (the kernel doubles it).
  // On loopback the "network" is two memory copies, and the kernel's autotuning (up to 4 MiB in
  // flight) pushes the data out of the cache: measured 2026-12-01, 2 ranks, 2 MiB 1.0 -> 0.6 ms,
  // 64 MiB 41 -> 21 ms; 4 ranks, 2 MiB 3.3-3.6 -> 1.6-1.7 ms. Across hosts the autotuning stays
  // (a fixed buffer would cap a fast link's bandwidth-delay product).
  static constexpr size_t kLocalSendBufferBytes = 128 << 10;
  // The receive buffers (a reduce's or reduce_scatter's, one per peer; a reduce's copy) are
  // kept for the next op up to this much in all, else freed after their op. Kept, they spare
  // each op its page faults (2 ranks, 64 MiB reduce_scatter: 25.6 ms kept, 48.5 freed); freed,
  // a 1 GiB reduce_scatter at 8 ranks does not hold 896 MiB for the group's life. The default;
  // TUTTI_GLOO_KEEP_BYTES sets another (keep_inboxes_up_to).
  static constexpr size_t kKeptInboxBytes = size_t{256} << 20;

  // Connects a second Gloo context of the group over `store` (keys under "direct/"); every rank
  // constructs it at the same point. `send_buffers[r]`: the send buffer for the connection to
  // rank r (0: the kernel's autotuning). Throws gloo's exceptions (the caller translates them),
  // and kInternal when a connection's socket cannot be found.
  DirectExchange(int rank, int world_size, const std::shared_ptr<tutti::Store>& store,
                 const std::shared_ptr<::gloo::transport::Device>& device,
                 std::chrono::milliseconds timeout, const std::vector<size_t>& send_buffers);
  ~DirectExchange();
  // The receive buffers kept between ops, in all (kKeptInboxBytes unless set).
  void keep_inboxes_up_to(size_t bytes) { kept_inbox_bytes_ = bytes; }

  // data = data_0 (fn) data_1 (fn) ... over the ranks, element-wise, in rank order.
  void allreduce_direct(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                        const OpContext& ctx);
  // The same sum by recursive doubling (a power of two ranks): log2(n) steps, each exchanging the
  // whole partial sum with one peer; every rank ends with the same bits (both partners of a step
  // reduce the lower-numbered group's sum with the upper's).
  void allreduce_doubling(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                          const OpContext& ctx);
  // The same sum through the ring (the order of each block's reduction follows the ring).
  void allreduce_ring(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                      const OpContext& ctx);
  // Returns once every rank has entered the barrier.
  void barrier(const OpContext& ctx);
  // data on every rank = data on `root`. `chain`: the bytes go down the ring of ranks from the
  // root, each rank passing on what came as it comes (every link carries them once: for large
  // messages); else the root sends them to every rank itself (one step: for small ones).
  void broadcast(void* data, size_t bytes, int root, bool chain, const OpContext& ctx);
  // out = every rank's `in` (`bytes` each), in rank order; `in` may be this rank's block of out.
  // Every rank sends its block to every other rank in one step ((n - 1) blocks each way, as many
  // as a ring moves).
  void allgather(const void* in, size_t bytes, void* out, const OpContext& ctx);
  // data on `root` = data_0 (fn) data_1 (fn) ... ; the others' data is left as it was. Every
  // rank sends its data to the root, which reduces in rank order as the direct allreduce does;
  // or, `by_ring` and 3 ranks or more (large messages: the root would take n - 1 of them), the
  // ring's allreduce on a copy (the sum in ring order).
  void reduce(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn, int root,
              bool by_ring, const OpContext& ctx);
  // out = blocks[rank] of every rank, reduced in rank order. Each rank sends block p to rank p
  // (one step; (n - 1) blocks each way, as many as a ring moves).
  void reduce_scatter(const std::vector<const void*>& blocks, void* out, size_t bytes,
                      size_t element_size, detail::ReduceFn fn, const OpContext& ctx);

  // One point-to-point message of a batch.
  struct Message {
    bool send = false;
    int peer = -1;
    void* data = nullptr;
    size_t bytes = 0;
    uint32_t tag = 0;  // the group's tag for it (both ends compute the same)
  };
  // Every message at once, each peer's in the order given, per direction: the group numbers a
  // pair's messages per direction, so the k-th send to a peer meets the peer's k-th receive from
  // this rank, whatever batches either side made of them. A message's header (its tag and size)
  // is read alone and checked before its data lands in the caller's memory.
  void p2p(const std::vector<Message>& messages, const OpContext& ctx);

  // Resets every connection (abort): a waiting exchange here and on the peers ends at once.
  void reset() { connections_.reset_all(); }
  // The rank a Gloo error message names (an address of this context's pairs), or -1.
  int rank_in(const std::string& message) const { return connections_.rank_in(message); }

 public:
  // What every rank sends first in an op. The magic says which algorithm sent it: ranks that
  // chose differently (another TUTTI_GLOO_ALLREDUCE or limit; the backend also compares the
  // settings when it connects) fail naming it instead of mixing up each other's bytes.
  struct Header {
    uint32_t magic;
    uint32_t tag;
    uint64_t bytes;
  };

 private:
  // One peer's share of a step: bytes to send to it and bytes to take from it, each in up to two
  // pieces (a header, then data). `arrived`, when set, is told of every receive (its byte count)
  // and may check what came or move `in` (the ring's staging buffer).
  // When `magic` is set, in[0] is the peer's header (into headers_ at the peer's place), which
  // run() checks against this op (`magic`, the op's tag, `total` bytes) as soon as it is in.
  struct Flow {
    int peer = -1;
    iovec out[2] = {};
    iovec in[2] = {};
    uint32_t magic = 0;
    uint64_t total = 0;
    uint32_t tag = 0;  // the tag the peer's header must carry (the op's, or the message's)
    // The header is read alone, and checked, before any data: set where in[1] is the caller's
    // memory, which a peer in another op must not write (one more receive call per message).
    bool header_alone = false;
    // Point-to-point: the peer's index in queues_, whose next message each direction takes up
    // when its current one is done; -1 for the collectives.
    int queue = -1;
    std::function<void(Flow&, size_t)> arrived;
  };
  // The ring's allreduce, its header's magic given (an allreduce's, or a reduce's).
  void ring(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn, uint32_t magic,
            const OpContext& ctx);
  // Moves every flow's bytes, all at once, until none is left; throws naming the peer on a
  // closed connection, kRemoteError on a header that is not this op's, and kTimeout at
  // `deadline` naming the peers still waited for.
  void run(std::vector<Flow>& flows, std::chrono::steady_clock::time_point deadline,
           const OpContext& ctx);
  // A flow that sends `mine` and then its `bytes` from `data` to `peer`, and receives the peer's
  // header (checked by run()) and as many bytes into `into` (`alone`: the header read first, on
  // its own).
  Flow exchange_flow(int peer, const Header& mine, const void* data, void* into,
                     bool alone = false);
  // The data one way: `mine` and its bytes from `data` to `peer`, whose `ack` (a header alone)
  // comes back; or `ack` to `peer`, whose header (checked, alone) and `mine.bytes` bytes come
  // into `into`.
  Flow send_flow(int peer, const Header& mine, const void* data, const Header& ack);
  Flow receive_flow(int peer, const Header& mine, void* into, const Header& ack);
  // out = input(0) (fn) input(1) (fn) ... in rank order, where input(me) is `mine` and input(r)
  // inbox_[r] for the others; `out` may be `mine`. Every rank that folds the same inputs gets the
  // same bits. inbox_[0] is the accumulator where `me` is not rank 0.
  void fold_in_rank_order(void* out, const void* mine, int me, size_t count, detail::ReduceFn fn);
  // Throws kRemoteError when a peer's header is not this op's.
  void check_header(int peer, const char* header, const Flow& f, const OpContext& ctx) const;
  // A point-to-point flow's messages, per direction, in order; `headers` what each send sends
  // first.
  struct PeerQueue {
    std::vector<const Message*> sends;
    std::vector<Header> headers;
    std::vector<const Message*> receives;
    size_t next_send = 0;
    size_t next_receive = 0;
  };
  // Frees the inboxes when they hold more than kept_inbox_bytes_ in all.
  void trim_inboxes();
  // Gives the flow its queue's next send (or receive); false when there is none.
  bool next_send(Flow& f);
  bool next_receive(Flow& f);
  // What a flow receives from its peer (every flow's in half): the peer's header, checked by
  // run() against `h` (kind, tag, bytes), then h.bytes into `into` (nothing where it is null);
  // `alone`: the header is read first, on its own.
  void expect(Flow& f, const Header& h, void* into, bool alone);

  int rank_;
  int world_size_;
  std::shared_ptr<::gloo::Context> context_;
  GlooConnections connections_;
  std::vector<int> fds_;                  // per rank: the socket to it (this rank's: -1)
  std::vector<std::vector<char>> inbox_;  // direct: per rank; doubling: this rank's
  size_t kept_inbox_bytes_ = kKeptInboxBytes;
  std::vector<char> headers_;      // 16 bytes per rank: what each peer sent first
  std::vector<char> staging_;      // ring: kStagingBytes
  std::vector<PeerQueue> queues_;  // p2p: one per flow of the op under way
};

}  // namespace tutti::gloo_backend
