// The leases by which consumers on the owner's host keep objects from being freed, in shared
// memory: no message and no system call on a get's path (internal to the direct transport).
//
// The owner keeps a slot page (a memfd; consumers map it read-only): one slot per object, its
// state and generation. Each consumer keeps a lane per owner (a memfd the owner maps read-only):
// the (slot, generation) pairs it holds. To lease, a consumer writes its lane entry, then reads the
// slot; it holds the object if the slot is still live with the same generation, else it clears the
// entry. To free, the owner marks the slot retiring, then reads every lane; it frees once no entry
// names the slot. Both orders are sequentially consistent (Dekker), so one side always sees the
// other: a lease is never granted on a freed object and an object is never freed under a lease.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "util/shared_memory.h"

namespace tutti::detail {

enum SlotState : uint32_t {
  kSlotFree = 0,
  kSlotReserved = 1,  // a ref exists; the data comes with fulfil()
  kSlotLive = 2,
  kSlotFailed = 3,    // fail(): gets report the owner's message
  kSlotRetiring = 4,  // no pin left: freed once no lease holds it
};

constexpr uint32_t kSlotCountsGets = 1;  // the owner wants to hear of completed gets

struct Slot {
  std::atomic<uint32_t> state{kSlotFree};
  std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> flags{0};
  uint32_t reserved = 0;
};

// The owner's slots.
class SlotPage {
 public:
  static constexpr uint32_t kCapacity = 1u << 16;
  static constexpr size_t kBytes = sizeof(Slot) * kCapacity;

  SlotPage() : pages_(SharedMemory::create("tutti-slots", kBytes, "direct transport: slots")) {}
  int fd() const { return pages_.fd(); }
  Slot& slot(uint32_t index) { return reinterpret_cast<Slot*>(pages_.data())[index]; }

 private:
  SharedMemory pages_;
};

// A consumer's view of an owner's slots.
class SlotView {
 public:
  explicit SlotView(int fd)
      : pages_(SharedMemory::map(fd, 0, SlotPage::kBytes, SharedMemory::Access::kReadOnly,
                                 "direct transport: an owner's slots", /*exact=*/true)) {}
  const Slot& slot(uint32_t index) const {
    return reinterpret_cast<const Slot*>(pages_.data())[index];
  }

 private:
  SharedMemory pages_;
};

struct LaneEntry {
  std::atomic<uint64_t> key{0};  // (slot + 1) << 32 | generation; 0: free
  std::atomic<uint64_t> reserved{0};
};

struct LaneHeader {
  std::atomic<uint32_t> high_water{0};  // entries at or above it are all free
  uint32_t reserved[15];
};

inline uint64_t lease_key(uint32_t slot, uint32_t generation) {
  return (static_cast<uint64_t>(slot) + 1) << 32 | generation;
}

// A consumer's lane to one owner.
class Lane {
 public:
  static constexpr uint32_t kEntries = 1u << 13;
  static constexpr size_t kBytes = sizeof(LaneHeader) + sizeof(LaneEntry) * kEntries;

  Lane() : pages_(SharedMemory::create("tutti-lane", kBytes, "direct transport: a lane")) {}
  int fd() const { return pages_.fd(); }
  // Holds (slot, generation) if the slot is live with that generation; returns the entry, or -1
  // with the slot's state in `state` (for a message, or to wait for a reserved object).
  int acquire(const SlotView& slots, uint32_t slot, uint32_t generation, uint32_t& state);
  // Ends a hold; true when the slot was retiring (the owner should look again).
  bool release(const SlotView& slots, int entry, uint32_t slot);

 private:
  LaneHeader& header() { return *reinterpret_cast<LaneHeader*>(pages_.data()); }
  LaneEntry& entry(int i) {
    return reinterpret_cast<LaneEntry*>(pages_.data() + sizeof(LaneHeader))[i];
  }

  SharedMemory pages_;
  std::mutex mutex_;
  std::vector<int> free_;
  uint32_t next_ = 0;
};

// The owner's view of one consumer's lane.
class LaneView {
 public:
  explicit LaneView(int fd)
      : pages_(SharedMemory::map(fd, 0, Lane::kBytes, SharedMemory::Access::kReadOnly,
                                 "direct transport: a consumer's lane", /*exact=*/true)) {}
  bool holds(uint32_t slot, uint32_t generation) const;

 private:
  SharedMemory pages_;
};

}  // namespace tutti::detail
