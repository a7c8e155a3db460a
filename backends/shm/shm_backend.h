// The shm backend: CPU tensors of ranks on one host, through one shared-memory segment per
// group (internal).
//
// The segment (shm_segment.h) holds a barrier and an abort word, per-rank control words and a
// doorbell, two small-message slots per rank (a sequence number, a tag and up to 16 KiB, 48
// bytes of it in the same cache line), two staging halves per rank for large messages
// (alternated from chunk to chunk, so no chunk waits for the readers of the one before) and a
// two-slot mailbox per (sender, receiver) pair.
//
// Collectives (shm_collectives.cc): large allreduce/reduce/reduce_scatter split the reduction
// across ranks (each reduces its slice of a chunk from every rank's staging area), with
// vectorised kernels; small messages (up to 16 KiB) are published in each rank's slot and read
// by every peer once its sequence number shows: one cache line per peer for a tiny message, no
// shared counter. Each collective checks that every rank called the same op (same tag), and
// fails with kRemoteError naming the rank otherwise.
//
// Point-to-point (shm_p2p.cc): messages go through the pair's mailbox in chunks, each slot
// carrying the message's tag, size and dtype, checked by the receiver. A batch advances all of
// its messages together, sleeping on the rank's doorbell (rung by every peer that frees or
// fills one of its slots), so rings and all-pairs exchanges cannot deadlock.
//
// Waits spin briefly while every rank has a core, then sleep on a futex until the op's
// deadline; a rank that never arrives is named in the kTimeout error, a rank whose process
// died is named within ~10 ms (kIoError), and abort() ends every wait at once, here and, through
// the abort word, in every peer (kRemoteError naming this rank).
//
// Threads: the group calls one op at a time; abort() may come from any thread.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "shm_publish.h"
#include "shm_segment.h"
#include "shm_symmetric.h"
#include "shm_wait.h"
#include "tutti/backend.h"
#include "tutti/error.h"
#include "util/stream_copy.h"

namespace tutti::shm_backend {

struct Header;
struct RankSlot;
struct Bell;
struct Channel;
struct SmallSlot;
struct SymSlot;

class ShmBackend : public Backend {
 public:
  explicit ShmBackend(const BackendContext& ctx);
  ~ShmBackend() override;

  const char* name() const override { return "shm"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }

  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override;
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
               const OpContext& ctx) override;
  WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
               const OpContext& ctx) override;
  WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                    const OpContext& ctx) override;
  void abort(const std::string& reason) override;
  std::unique_ptr<SymmetricRegion> create_symmetric(size_t bytes) override;

 private:
  struct Op;        // one collective in flight: deadline, tag check
  struct Transfer;  // one message of a batch in flight
  Op begin_op(const OpContext& ctx);
  void end_op(const Op& op);
  void sync(Op& op);
  // Publishes `bytes` of payload and waits for every peer's publication; `reads`: how many bytes
  // of a peer's payload this rank reads once it returns (of rank `from`'s only; -1: every peer's).
  // The payload goes in the way `how` says; `timer` (if any) learns when it is published and when
  // the waits are over.
  void exchange(Op& op, const void* payload, size_t bytes, size_t reads, int from = -1,
                const PublishChooser::Pick& how = PublishChooser::Pick{},
                PublishTimer* timer = nullptr);
  // The small path's way for a payload of `bytes` (shm_publish.h: timed from kMinBytes).
  PublishChooser::Pick pick_small(PublishChooser::Kind kind, size_t bytes) {
    return bytes < PublishChooser::kMinBytes ? PublishChooser::Pick{} : publish_.pick(kind, bytes);
  }
  [[noreturn]] void mismatch(const Op& op, int rank, uint32_t theirs) const;
  void reduce_chunks(const TensorView& t, ReduceOp reduce_op, int root, Op& op);
  // An op's copies into the staging areas or its small-message slot, by the way publish_ picked
  // (shm_publish.h); and, once a timed one is done, its cost (shm_publish.h's PublishTimer).
  // Inline: the small path's payloads are mostly a few bytes.
  void publish(const PublishChooser::Pick& how, void* dst, const void* src, size_t n) const {
    if (how.stream) {
      detail::stream_copy(dst, src, n);
    } else {
      std::memcpy(dst, src, n);
    }
  }
  void published(PublishChooser::Kind kind, size_t bytes, const PublishChooser::Pick& how,
                 const PublishTimer& timer);
  void published(PublishChooser::Kind kind, size_t bytes, const PublishChooser::Pick& how,
                 Clock::duration took, bool disturbed);
  // Symmetric memory (shm_symmetric_ops.cc). Before an op's first barrier, a rank announces
  // where its memory for the op lies in symmetric memory, if it does (its tag then carries
  // kSymmetricTag); after it, announced(q) says whether rank q did, and symmetric_of where
  // rank q's memory is mapped here (kRemoteError naming the op when it is not). The single-copy
  // ops run when every rank announced (root: the root's alone for broadcast), end with a barrier.
  bool announce_symmetric(Op& op, const void* p, size_t bytes);
  // The staged ops' agreement: announces (where `eligible`) and, where this rank did, meets the
  // others at the op's first barrier before publishing anything; true where every rank
  // announced (the single-copy path). Otherwise the staged path runs, and after its first
  // chunk's barrier meet_late_publishers() has every rank meet the announced ones, which only
  // then published that chunk.
  bool every_rank_symmetric(Op& op, const void* p, size_t bytes, bool eligible = true);
  void meet_late_publishers(Op& op);
  bool announced(const Op& op, int q) const;
  char* symmetric_of(const Op& op, int q, size_t bytes, const char* what) const;
  void reduce_symmetric(const TensorView& t, ReduceOp reduce_op, int root, Op& op);
  void allgather_symmetric(const std::vector<TensorView>& out, const TensorView& in, Op& op);
  void reduce_scatter_symmetric(const TensorView& out, const TensorView& in, ReduceOp reduce_op,
                                Op& op);
  bool advance(Transfer& t, const OpContext& ctx);
  bool can_advance(const Transfer& t) const;
  void run_batch(std::vector<Transfer>& transfers, const OpContext& ctx);

  // Waits until ready() holds. Throws kAborted (this process aborted), kRemoteError (a peer
  // aborted, or left while waiting_on(it)), kIoError (the process of a peer waiting_on(it)
  // died), or what on_timeout() throws. op_seq: the collective waited in (0: point-to-point,
  // which any peer's abort ends). `op`: the collective's, whose tag each nap compares with
  // every peer's that began the same collective (check_agreement). Defined in shm_internal.h.
  // `still_of`, where given, narrows the ranks whose stillness lets the wait sleep (a barrier
  // watches every peer for its death but waits only for those not yet arrived); waiting_on's
  // otherwise. A collective's wait (`op` given) also paces its first polls (SpinPolicy::paced).
  template <typename Ready, typename WaitingOn, typename OnTimeout,
            typename StillOf = bool (*)(int)>
  void wait_until(Ready ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                  const OpContext& ctx, uint64_t op_seq, Clock::time_point deadline,
                  WaitingOn waiting_on, OnTimeout on_timeout, const Op* op = nullptr,
                  StillOf still_of = nullptr);
  // kRemoteError (mismatch) when a peer began collective op.seq under another tag.
  void check_agreement(const Op& op) const;
  bool stopped(uint64_t op_seq) const;
  void throw_if_stopped(const OpContext& ctx, uint64_t op_seq) const;
  std::optional<Error> gone_peer(const OpContext& ctx,
                                 const std::function<bool(int)>& waiting_on) const;
  std::string ranks_where(const std::function<bool(int)>& pending) const;
  void set_spin_policy(int local);
  void look_again(Clock::time_point now);
  // Publishes the CPU this rank runs on now (Bell::cpu), for peers' waits (shm_internal.h).
  void note_cpu() const;
  // How recently a thread must have lost its CPU for its CPU to count as contended
  // (thread_lost_cpu_lately, shm_cpus.h).
  static constexpr std::chrono::milliseconds kContendedWindow{100};
  void ring(int rank) const;
  void wake_everyone() const;

  SmallSlot& small_slot(int rank, uint32_t parity) const;
  char* small_payload(int rank, uint32_t parity, size_t bytes) const;
  char* stage(int rank, int half) const;
  // A reduce's slice of a full chunk, in elements of es bytes: W of them fit a staging half (the
  // constructor makes chunk_ at least 8 bytes a rank), each at the same place in every chunk's
  // half. Both reduce paths chunk by W of these, so that an element has the same owner, and its
  // sum the same order, on either; a reduce_scatter's chunk is this many of each of W blocks.
  size_t reduce_stride(size_t es) const {
    return std::max<size_t>(1, chunk_ / es / static_cast<size_t>(world_size_));
  }
  // Where rank q's slice of a chunk of `len` elements begins (its end: q + 1's begin). Both
  // reduce paths split a chunk so.
  size_t slice_begin(size_t len, int q) const {
    return len * static_cast<size_t>(q) / static_cast<size_t>(world_size_);
  }
  char* mailbox(int src, int dst, int slot) const;
  // Populates mailbox (src, dst) on its first use here; kUnavailable naming /dev/shm when it
  // has no room.
  void ensure_mailbox(int src, int dst, const OpContext& ctx);
  Channel& channel(int src, int dst) const;

  int rank_;
  int world_size_;
  size_t chunk_ = 0;                 // bytes per staging half
  size_t mail_ = 0;                  // bytes per mailbox slot
  std::vector<uint8_t> mail_ready_;  // by src x w + dst: its pages populated (ensure_mailbox)
  AdaptiveSpin spin_;
  // The spin policy's inputs, looked at again every kLookAgain of ops (look_again): the CPUs the
  // ranks may run on together, how many of them, and how many processes competed for them.
  static constexpr std::chrono::seconds kLookAgain{1};
  cpu_set_t ranks_cpus_{};
  int cores_ = 1;
  int spin_local_ = 1;
  bool oversubscribed_ = false;  // more ranks (of all local groups) than cores: set_spin_policy
  // The slice (ns) a waiting thread asks the scheduler for, 0: none (shm_slice.h).
  uint64_t slice_ns_ = 0;
  void shorten_slice_once() const;
  // This rank's beat (Bell::beat) and, by rank, the beat its waits last saw (wait_until).
  uint32_t beats_ = 0;
  std::vector<uint32_t> seen_beat_;
  // A wait's looks (every 256 polls, ~0.5 us) before it publishes its beat and looks at its
  // peers' (~8 us), then the looks in a row at which every rank waited for sat still inside a
  // wait of its own before it gives up polling and sleeps (~60 us more).
  static constexpr int kBeatFrom = 16;
  static constexpr int kStillLooks = 128;
  int still_looks_ = kStillLooks;  // TUTTI_SHM_STILL_LOOKS (0: never)
  Clock::time_point next_look_{};
  ShmSegment segment_;
  Header* header_ = nullptr;
  RankSlot* slots_ = nullptr;
  Bell* bells_ = nullptr;
  Channel* channels_ = nullptr;
  SymSlot* sym_ = nullptr;  // by rank: where its current collective's memory lies (and whether
                            // it times its broadcast as root)
  char* small_ = nullptr;
  char* staging_ = nullptr;
  char* mailboxes_ = nullptr;
  uint32_t epoch_ = 0;  // barriers this rank has entered
  uint64_t flips_ = 0;  // staging halves used so far (the same count on every rank)
  uint64_t ops_ = 0;    // collectives begun so far
  std::atomic<uint64_t> completed_ops_{0};     // collectives completed so far
  std::vector<const void*> inputs_;            // one pointer per rank, for reductions (sized once)
  std::vector<const void*> block_inputs_;      // the same, advanced to one block of a slice
  std::vector<char> block_out_;                // a block of a reduce on its way to the root
  std::vector<int> pidfds_;                    // by rank: a handle on each peer's process, or -1
  std::shared_ptr<SymmetricTable> symmetric_;  // regions of allocate_symmetric

  std::atomic<bool> aborted_{false};  // abort() was called in this process
  mutable std::mutex reason_mutex_;
  std::string reason_;
  // How ops write the staging areas and slots: last, as its ~14 KB of cells (touched by few ops)
  // would otherwise lie between the members every op reads.
  PublishChooser publish_;
};

}  // namespace tutti::shm_backend
