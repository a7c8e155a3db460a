// The layout of the shm backend's segment (internal). Every word another rank writes sits on
// its own cache line.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "tutti/op_type.h"

namespace tutti::shm_backend {

// Messages up to this size reduce in one step: every rank folds the whole message from every
// rank's published copy (no barrier); larger ones split the work (a barrier per chunk, one more
// first).
constexpr size_t kSmallBytes = 16 * 1024;

// n rounded up to a multiple of a.
inline size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// A staging half's bytes: the chunk asked for (TUTTI_SHM_CHUNK_BYTES) in whole pages, and at
// least an element of the widest dtype (8 bytes) for each of `world` ranks, since reduce and
// reduce_scatter split a chunk into W slices of one element or more. Every rank computes the same.
inline size_t staging_chunk(size_t asked, size_t world, size_t page) {
  return std::max(align_up(asked, page), align_up(world * 8, page));
}

struct alignas(64) Line {
  std::atomic<uint32_t> value{0};
};

struct alignas(64) Header {
  Line count;        // barrier: ranks arrived in the current generation
  Line generation;   // barrier: bumped by the last rank to arrive
  Line sleepers;     // barrier: ranks asleep on `generation`
  Line abort_owner;  // 0, or 1 + the first rank that aborted
  Line abort_op;     // the first collective that rank had not completed (from 1)
  Line abort_ready;  // 1 once abort_reason is written
  char abort_reason[256];
};

struct alignas(64) RankSlot {
  std::atomic<uint32_t> arrived{0};  // the last barrier epoch this rank entered
  std::atomic<uint32_t> tag[2];      // the tag of its current collective, by op parity
  std::atomic<uint32_t> left{0};     // 1 once this rank has destroyed its group
  std::atomic<int32_t> pid{0};       // its process, and when it started (clock ticks since
  std::atomic<uint32_t> begun{0};    // the seq of the last collective it began (after its tag)
  std::atomic<uint64_t> start{0};    // boot), so that a reused pid is never taken for it
  // What its current collective is (by op parity), for mismatch messages: see pack_signature.
  std::atomic<uint64_t> signature[2][2];
};
static_assert(sizeof(RankSlot) == 64, "a rank's control words fill one cache line");

// An op's signature in two words, written next to its tag: op, dtype, reduce op, devices and
// root, then the count. Enough to print what a peer called; the tag compares every field.
inline void pack_signature(const OpSignature& sig, uint64_t out[2]) {
  out[0] = static_cast<uint64_t>(sig.op) | static_cast<uint64_t>(sig.dtype) << 8 |
           static_cast<uint64_t>(static_cast<uint8_t>(sig.reduce_op)) << 16 |
           static_cast<uint64_t>(static_cast<uint8_t>(sig.devices)) << 24 |
           static_cast<uint64_t>(static_cast<uint32_t>(sig.root)) << 32;
  out[1] = static_cast<uint64_t>(sig.count);
}

inline OpSignature unpack_signature(const uint64_t in[2]) {
  OpSignature sig;
  sig.op = static_cast<OpType>(in[0] & 0xff);
  sig.dtype = static_cast<DType>((in[0] >> 8) & 0xff);
  sig.reduce_op = static_cast<int8_t>((in[0] >> 16) & 0xff);
  sig.devices = static_cast<int>((in[0] >> 24) & 0xff);
  sig.root = static_cast<int32_t>(static_cast<uint32_t>(in[0] >> 32));
  sig.count = static_cast<int64_t>(in[1]);
  return sig;
}

// Where a rank's memory for its current large collective (by op parity) lies in symmetric
// memory: a region (0: none) and the offset in it. Written before the op's first barrier, read
// after it by the peers, when the rank's tag carries kSymmetricTag (shm_symmetric_ops.cc).
// Beside them, as a staged broadcast's root, whether it times the op (the op's number if so, its
// complement if not; read after the first barrier: such an op ends with one more,
// shm_collectives.cc).
struct alignas(64) SymSlot {
  std::atomic<uint64_t> region[2];
  std::atomic<uint64_t> offset[2];
  std::atomic<uint32_t> timed_broadcast[2];
};

// Folded into a rank's published tag for a large collective whose memory is in symmetric
// memory: the first barrier's tag check tells every rank which ranks announced theirs (all: the
// single-copy path; some: every rank takes the staged one).
constexpr uint32_t kSymmetricTag = 0x5a3c0001u;

// A rank's doorbell: rung by every peer that fills or frees one of its mailbox slots.
struct alignas(64) Bell {
  Line ring;
  Line sleepers;
  Line cpu;  // 1 + the CPU this rank was last noted on (each op, around each wait; 0: none yet)
  // 1 while this rank runs a batch of point-to-point ops: a peer whose wait for it outlasted the
  // polling budget polls on only for a rank inside one (shm_internal.h).
  Line in_p2p;
  // Odd while this rank polls in a wait, and then bumped by 2 every 256 polls; even outside its
  // waits. A peer waiting for this rank that sees it odd and unchanged for a while knows it is
  // not running (preempted, or asleep) and sleeps until it is rung instead of polling
  // (shm_internal.h says why).
  Line beat;
};

// Collectives are numbered in 32 bits (RankSlot::begun, Header::abort_op), which wrap after 2^32
// ops (an hour of 1 us allreduces): compared as a signed difference, so "seq at or after mark"
// holds across the wrap for numbers less than 2^31 apart.
inline bool seq_at_or_after(uint32_t seq, uint32_t mark) {
  return static_cast<int32_t>(seq - mark) >= 0;
}

// Whether a peer that a wait has outlasted its polling budget on (with the waiting rank kept off
// its CPU meanwhile) comes as soon as it runs again, so that polling on for it pays: inside the
// collective waited in already (its begun at or past op_seq), or, for a point-to-point wait
// (op_seq 0), inside a batch of point-to-point ops and not asleep in it (only the rank itself
// sleeps on its bell; asleep, it waits for a third rank's ring, not for its CPU).
inline bool comes_once_it_runs(const RankSlot& slot, const Bell& bell, uint32_t op_seq) {
  if (op_seq != 0) {
    return seq_at_or_after(slot.begun.load(std::memory_order_acquire), op_seq);
  }
  return bell.in_p2p.value.load(std::memory_order_relaxed) != 0 &&
         bell.sleepers.value.load(std::memory_order_relaxed) == 0;
}

// A wait's looks at the ranks it waits for (one per 256 polls): from the `beat_from`-th look on,
// each look publishes this rank's beat and reads theirs; once `still_looks` looks in a row found
// every rank it waits for still inside a wait of its own (Bell::beat odd and unchanged since the
// last look: not polling, so off its CPU or asleep), the wait may sleep (shm_internal.h), and the
// count starts again. still_looks 0: never. Each look: begin_look(), then peer() for each rank
// waited for while watching(), then end_look().
class StillWatch {
 public:
  StillWatch(int beat_from, int still_looks) : beat_from_(beat_from), still_looks_(still_looks) {}
  // Whether this look publishes this rank's beat (from the beat_from-th look on).
  bool begin_look() {
    all_ = true;
    any_ = false;
    beating_ = ++looks_ >= beat_from_;
    return beating_;
  }
  // Whether a look of this wait has published this rank's beat (to be made even at its end).
  bool beat_published() const { return looks_ >= beat_from_; }
  // Whether this look still reads beats: it does from the beat_from-th look on, where the wait
  // may sleep at all, until it has seen a rank moving (the look's answer is then known).
  bool watching() const { return beating_ && still_looks_ > 0 && all_; }
  // One rank's beat, and the one seen of it at the last look (updated).
  void peer(uint32_t beat, uint32_t& seen) {
    any_ = true;
    if ((beat & 1) == 0 || beat != seen) all_ = false;
    seen = beat;
  }
  // Whether the wait may sleep now: this look made still_looks in a row at which every rank
  // waited for sat still (a look that found one moving, outside a wait, or no rank at all breaks
  // the row). The row starts again after a yes.
  bool end_look() {
    still_ = watching() && any_ ? still_ + 1 : 0;
    if (still_ < still_looks_ || still_looks_ <= 0) return false;
    still_ = 0;
    return true;
  }

 private:
  const int beat_from_;
  const int still_looks_;
  int looks_ = 0;
  int still_ = 0;
  bool beating_ = false;
  bool all_ = true;
  bool any_ = false;
};

// A rank's publication for small ops: seq says which op its payload (inline up to
// kInlineBytes, else in the kSmallBytes that follow the line) and tag belong to. Peers wait on
// seq; one cache line carries a tiny message.
struct alignas(64) SmallSlot {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
  uint32_t tag;
  uint32_t reserved;
  char inline_payload[48];
};
constexpr size_t kInlineBytes = sizeof(SmallSlot::inline_payload);
constexpr size_t kSmallSlotBytes = sizeof(SmallSlot) + kSmallBytes;
// A reader polls the lines of a payload up to this size together with the number (exchange()).
constexpr size_t kTouchBytes = 256;

// What the sender says of the message a mailbox slot carries a chunk of.
struct SlotMeta {
  uint32_t tag = 0;
  uint32_t dtype = 0;
  uint64_t bytes = 0;  // the whole message
  uint64_t seq = 0;
};

// One sender -> one receiver: the sender's line (chunks written, and what they belong to),
// then the receiver's (chunks consumed).
struct alignas(64) Channel {
  std::atomic<uint32_t> sent{0};
  uint32_t reserved = 0;
  SlotMeta meta[2];
  alignas(64) std::atomic<uint32_t> acked{0};
};

}  // namespace tutti::shm_backend
