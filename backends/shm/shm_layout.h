// The layout of the shm backend's segment (internal). Every word another rank writes sits on
// its own cache line.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tutti::shm_backend {

// Messages up to this size reduce in one step: every rank folds the whole message from every
// rank's published copy (no barrier); larger ones split the work (two barriers per chunk).
constexpr size_t kSmallBytes = 16 * 1024;

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
  std::atomic<int64_t> pid{0};       // its process, and when it started (clock ticks since
  std::atomic<uint64_t> start{0};    // boot), so that a reused pid is never taken for it
};

// A rank's doorbell: rung by every peer that fills or frees one of its mailbox slots.
struct alignas(64) Bell {
  Line ring;
  Line sleepers;
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
