// The shm transport's consumer side of owners' blocks (internal): the blocks it has mapped, per
// owner, cached (the last kMappingCache used) with a descriptor kept for private mappings, and
// the owners' tables of live blocks (shm_blocks.h) that tell it which to drop.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>

#include "tutti/tensor_transport.h"
#include "util/shared_memory.h"

namespace tutti::shm_backend {

// A mapping of an owner's block: shared and read-only (cached, and lent to borrowers), or a
// private copy-on-write one (one per block per get that asks for it, and one more for each of
// the get's tensors that overlaps another in that block).
struct Mapping {
  detail::SharedMemory memory;
  const char* data() const { return memory.data(); }
  size_t size() const { return memory.size(); }
};

class MappingCache {
 public:
  static constexpr size_t kMappingCache = 64;  // owner blocks kept mapped

  // Block `block` of the request's owner, mapped read-only (cached), or privately (copy-on-write,
  // writable; never cached). Asks the owner for the block's descriptor the first time.
  std::shared_ptr<Mapping> map(const FetchRequest& request, uint64_t block, bool private_copy);

 private:
  using Key = std::pair<std::array<uint8_t, 16>, uint64_t>;  // owner, block
  struct TableView;
  struct Entry {
    Entry() = default;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry();
    std::shared_ptr<Mapping> shared;
    int fd = -1;  // the block's file, for private mappings
    uint64_t offset = 0;
    std::shared_ptr<TableView> table;  // its owner's live blocks; null from an owner without one
    int64_t slot = 0;                  // the block's slot there (0: not listed)
    std::list<Key>::iterator position;
  };

  std::shared_ptr<Entry> entry(const FetchRequest& request, uint64_t block);
  std::shared_ptr<TableView> table_of(const std::array<uint8_t, 16>& owner, int fd);
  void sweep_locked();
  void drop_locked(std::map<Key, std::shared_ptr<Entry>>::iterator it);

  std::mutex mutex_;
  std::list<Key> lru_;
  std::map<Key, std::shared_ptr<Entry>> cache_;
  std::map<std::array<uint8_t, 16>, std::weak_ptr<TableView>> tables_;  // by owner
};

}  // namespace tutti::shm_backend
