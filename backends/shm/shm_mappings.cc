#include "shm_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "shm_blocks.h"
#include "shm_messages.h"
#include "tutti/error.h"

namespace tutti::shm_backend {

// An owner's table of live blocks, mapped read-only.
struct MappingCache::TableView {
  detail::SharedMemory memory;
  uint64_t seen = 0;  // deallocations() when this consumer last looked (under its cache lock)

  const std::atomic<uint64_t>* words() const {
    return reinterpret_cast<const std::atomic<uint64_t>*>(memory.data());
  }
  // True unless the owner listed `block` in `slot` and it is gone since (no slot: not listed).
  bool live(int64_t slot, uint64_t block) const {
    return slot <= 0 || slot >= static_cast<int64_t>(kTableEntries) ||
           words()[slot].load(std::memory_order_acquire) == block;
  }
  uint64_t deallocations() const { return words()[0].load(std::memory_order_acquire); }
};

std::shared_ptr<Mapping> MappingCache::map(const FetchRequest& request, uint64_t block,
                                           bool private_copy) {
  const std::shared_ptr<Entry> e = entry(request, block);
  if (!private_copy) return e->shared;
  auto m = std::make_shared<Mapping>();
  const int fd = ::fcntl(e->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    throw Error(ErrorCode::kIoError, std::string("shm transport: dup: ") + std::strerror(errno));
  }
  m->memory = detail::SharedMemory::map(
      fd, e->offset, e->shared->size(), detail::SharedMemory::Access::kCopyOnWrite,
      "shm transport: mapping the owner's block " + std::to_string(block) + " privately");
  return m;
}

std::shared_ptr<MappingCache::Entry> MappingCache::entry(const FetchRequest& request,
                                                         uint64_t block) {
  const Key key{request.owner.owner().uuid, block};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sweep_locked();
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second->position);
      return it->second;
    }
  }
  std::vector<int> fds;
  const std::string reply = request.owner.call(block_request(block), &fds);
  // Every descriptor the reply carried is closed on every path: the first is kept by the entry.
  auto e = std::make_shared<Entry>();
  struct CloseRest {
    std::vector<int>& fds;
    ~CloseRest() {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
    }
  } close_rest{fds};
  if (fds.empty()) {
    throw Error(ErrorCode::kInternal,
                "shm transport: the owner sent no descriptor for block " + std::to_string(block));
  }
  const BlockReply r = parse_block_reply(reply);
  if (fds.size() > 1) {
    e->table = table_of(key.first, std::exchange(fds[1], -1));
  }
  const int shared_fd = ::fcntl(fds[0], F_DUPFD_CLOEXEC, 0);
  if (shared_fd < 0) {
    throw Error(ErrorCode::kIoError, std::string("shm transport: dup: ") + std::strerror(errno));
  }
  e->shared = std::make_shared<Mapping>();
  // Against the file as it is (a shorter one would fault the reader), never the reply's word.
  e->shared->memory = detail::SharedMemory::map(
      shared_fd, r.offset, r.bytes, detail::SharedMemory::Access::kReadOnly,
      "shm transport: mapping the owner's block " + std::to_string(block));
  e->fd = std::exchange(fds[0], -1);
  e->offset = r.offset;
  e->slot = r.slot;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;  // another get mapped it meanwhile
  lru_.push_front(key);
  e->position = lru_.begin();
  cache_[key] = e;
  while (cache_.size() > kMappingCache) drop_locked(cache_.find(lru_.back()));
  return e;
}

// The consumer's view of an owner's table of live blocks, mapped from `fd` (taken) unless it
// already is.
std::shared_ptr<MappingCache::TableView> MappingCache::table_of(
    const std::array<uint8_t, 16>& owner, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = tables_.begin(); it != tables_.end();) {
    it = it->second.expired() && it->first != owner ? tables_.erase(it) : std::next(it);
  }
  auto& known = tables_[owner];
  if (auto t = known.lock()) {
    ::close(fd);
    return t;
  }
  auto t = std::make_shared<TableView>();
  try {
    t->memory =
        detail::SharedMemory::map(fd, 0, kTableBytes, detail::SharedMemory::Access::kReadOnly,
                                  "shm transport: an owner's table of live blocks");
  } catch (const Error&) {
    return nullptr;  // cached by count only
  }
  t->seen = t->deallocations();
  known = t;
  return t;
}

// Drops cached mappings of blocks their owners have deallocated (borrowed views keep theirs);
// nothing to look at while no owner has deallocated a block since the last look.
void MappingCache::sweep_locked() {
  bool changed = false;
  for (auto& [owner, known] : tables_) {
    auto t = known.lock();
    if (!t) continue;
    const uint64_t now = t->deallocations();
    if (now != t->seen) changed = true;
    t->seen = now;
  }
  if (!changed) return;
  for (auto it = cache_.begin(); it != cache_.end();) {
    const Entry& e = *it->second;
    auto next = std::next(it);
    if (e.table && !e.table->live(e.slot, it->first.second)) drop_locked(it);
    it = next;
  }
}

void MappingCache::drop_locked(std::map<Key, std::shared_ptr<Entry>>::iterator it) {
  lru_.erase(it->second->position);
  cache_.erase(it);  // views lent from it keep its mapping; a map() in progress keeps the entry
}

MappingCache::Entry::~Entry() {
  if (fd >= 0) ::close(fd);
}

}  // namespace tutti::shm_backend
