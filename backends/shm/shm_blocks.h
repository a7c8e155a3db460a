// The shm transport's owner side (internal): the blocks its consumers may map.
// - Shareable memory from TransferAgent::allocate: one sealed memfd per allocation.
// - Memory the application registered with its file (register_memory with an fd): a read-only
//   descriptor of the file, so consumers can map but never write it. Registered without a file:
//   only recorded (consumers copy such tensors by cross-memory read).
// A table of live blocks, one sealed memfd consumers map read-only with their first block, lists
// each block in a slot of its own while it lives (1..kTableEntries-1, reused once free), and
// counts deallocations in word 0: a consumer looks at its mappings only when that changed, and
// drops those of blocks gone since, so their memory goes back. Blocks past the table's size get
// no slot: consumers keep those mapped by count only.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tutti/tensor_transport.h"
#include "util/shared_memory.h"

namespace tutti::shm_backend {

constexpr size_t kTableEntries = 1u << 16;
constexpr size_t kTableBytes = kTableEntries * sizeof(uint64_t);

class OwnerBlocks {
 public:
  OwnerBlocks() = default;
  ~OwnerBlocks();
  OwnerBlocks(const OwnerBlocks&) = delete;
  OwnerBlocks& operator=(const OwnerBlocks&) = delete;

  TensorView allocate(size_t bytes, DType dtype);
  void deallocate(const TensorView& memory);
  bool owns(const TensorView& memory) const;
  void register_memory(const TensorView& region, int fd, uint64_t fd_offset);
  void unregister_memory(const TensorView& region);

  // Each tensor's place; the blob names, per tensor, its block and the block's size (zeros for
  // a tensor outside every block).
  Publication publish(ObjectId object, const std::vector<TensorView>& tensors);
  void unpublish(ObjectId object) noexcept;
  // A consumer's block request: the block's descriptor (and the table's) into `fds`, the reply.
  // kInvalidUsage for a block deallocated or holding no published object.
  std::string answer(uint64_t block, std::vector<int>* fds);

 private:
  struct Block {
    uint64_t id = 0;
    char* base = nullptr;
    size_t size = 0;
    detail::SharedMemory memory;  // allocate()'s; empty for registered memory
    int fd = -1;                  // registered memory: a read-only descriptor of its file
    uint64_t offset = 0;          // where in the file `base` lies
    int64_t slot = 0;             // in the table of live blocks; 0: none
  };

  const Block* block_of(const char* p, size_t bytes) const;
  void list_locked(Block& b);
  void unlist_locked(const Block& b);
  void forget_locked(std::map<char*, Block>::iterator it);

  mutable std::mutex mutex_;
  std::map<char*, Block> blocks_;  // by base address
  std::map<uint64_t, char*> by_id_;
  std::map<uint64_t, std::vector<uint64_t>> published_;  // object id -> the blocks it publishes
  std::map<uint64_t, int> publications_;                 // block -> objects publishing it
  std::map<char*, size_t> plain_;                        // registered without a file
  uint64_t next_block_ = 0;
  detail::SharedMemory table_;  // the live blocks; empty when it could not be made
  bool table_tried_ = false;
  std::vector<int64_t> free_slots_;
  int64_t next_slot_ = 1;  // slot 0 counts deallocations
};

}  // namespace tutti::shm_backend
