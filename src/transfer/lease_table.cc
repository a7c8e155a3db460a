#include "transfer/lease_table.h"

#include "tutti/error.h"

namespace tutti::detail {

int Lane::acquire(const SlotView& slots, uint32_t slot, uint32_t generation, uint32_t& state) {
  int index;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else if (next_ < kEntries) {
      index = static_cast<int>(next_++);
      header().high_water.store(next_);
    } else {
      throw Error(ErrorCode::kUnavailable,
                  "direct transport: " + std::to_string(kEntries) +
                      " leases held on one owner at once: release some borrows");
    }
  }
  entry(index).key.store(lease_key(slot, generation));  // seq_cst: then look at the slot
  const Slot& s = slots.slot(slot);
  state = s.state.load();
  if (s.generation.load() == generation && state == kSlotLive) return index;
  if (s.generation.load() != generation) state = kSlotFree;  // the object is gone
  entry(index).key.store(0);
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(index);
  return -1;
}

bool Lane::release(const SlotView& slots, int index, uint32_t slot) {
  entry(index).key.store(0);  // seq_cst: then look at the slot
  const bool retiring = slots.slot(slot).state.load() == kSlotRetiring;
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(index);
  return retiring;
}

bool LaneView::holds(uint32_t slot, uint32_t generation) const {
  const auto& header = *reinterpret_cast<const LaneHeader*>(pages_.data());
  const auto* entries = reinterpret_cast<const LaneEntry*>(pages_.data() + sizeof(LaneHeader));
  const uint64_t key = lease_key(slot, generation);
  const uint32_t n = std::min(header.high_water.load(), Lane::kEntries);
  for (uint32_t i = 0; i < n; ++i) {
    if (entries[i].key.load() == key) return true;
  }
  return false;
}

}  // namespace tutti::detail
