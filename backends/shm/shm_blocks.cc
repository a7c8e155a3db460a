#include "shm_blocks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iterator>

#include "shm_messages.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

std::atomic<uint64_t>* table_words(const detail::SharedMemory& table) {
  return reinterpret_cast<std::atomic<uint64_t>*>(table.data());
}

}  // namespace

OwnerBlocks::~OwnerBlocks() {
  for (auto& [base, b] : blocks_) {
    if (b.fd >= 0) ::close(b.fd);
  }
}

TensorView OwnerBlocks::allocate(size_t bytes, DType dtype) {
  Block b;
  b.memory = detail::SharedMemory::create(
      "tutti-rdt", detail::page_round(bytes),
      "shm transport: allocating " + std::to_string(bytes) + " shareable bytes");
  b.base = b.memory.data();
  b.size = b.memory.size();
  std::lock_guard<std::mutex> lock(mutex_);
  b.id = ++next_block_;
  list_locked(b);
  char* base = b.base;
  by_id_[b.id] = base;
  blocks_.emplace(base, std::move(b));
  return TensorView(base, dtype, {static_cast<int64_t>(bytes / dtype_size(dtype))});
}

void OwnerBlocks::deallocate(const TensorView& memory) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(static_cast<char*>(memory.data()));
  if (it == blocks_.end() || it->second.memory.data() == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "shm transport: " + memory.str() + " is not the start of an allocate()d block");
  }
  forget_locked(it);
}

bool OwnerBlocks::owns(const TensorView& memory) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(static_cast<char*>(memory.data()));
  return it != blocks_.end() && it->second.memory.data() != nullptr;
}

void OwnerBlocks::register_memory(const TensorView& region, int fd, uint64_t fd_offset) {
  char* base = static_cast<char*>(region.data());
  const size_t bytes = region.nbytes();
  std::lock_guard<std::mutex> lock(mutex_);
  auto next = blocks_.lower_bound(base);
  const bool overlaps = (next != blocks_.end() && next->first < base + bytes) ||
                        (next != blocks_.begin() &&
                         std::prev(next)->second.base + std::prev(next)->second.size > base);
  if (overlaps || plain_.count(base) != 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "shm transport: " + region.str() + " overlaps memory already registered or allocated");
  }
  if (fd < 0) {
    // Nothing to map: gets read it across processes; registering only records it.
    plain_[base] = bytes;
    return;
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  struct stat st {};
  if (reinterpret_cast<uintptr_t>(base) % page != 0 || fd_offset % page != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "shm transport: register_memory needs a page-aligned region and file offset (" +
                    region.str() + ", offset " + std::to_string(fd_offset) + ")");
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < fd_offset + bytes) {
    throw Error(ErrorCode::kInvalidArgument, "shm transport: descriptor " + std::to_string(fd) +
                                                 " is not a file holding " + std::to_string(bytes) +
                                                 " bytes at offset " + std::to_string(fd_offset));
  }
  // Consumers get a read-only descriptor: they cannot map the application's memory writable.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const int ro = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    throw Error(ErrorCode::kInvalidArgument, "shm transport: reopening descriptor " +
                                                 std::to_string(fd) +
                                                 " read-only: " + std::strerror(errno));
  }
  Block b;
  b.id = ++next_block_;
  b.fd = ro;
  b.base = base;
  b.size = bytes;
  b.offset = fd_offset;
  list_locked(b);
  by_id_[b.id] = base;
  blocks_.emplace(base, std::move(b));
}

void OwnerBlocks::unregister_memory(const TensorView& region) {
  char* base = static_cast<char*>(region.data());
  std::lock_guard<std::mutex> lock(mutex_);
  if (plain_.erase(base) != 0) return;
  auto it = blocks_.find(base);
  if (it == blocks_.end() || it->second.fd < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "shm transport: " + region.str() + " is not the start of registered memory");
  }
  forget_locked(it);
}

Publication OwnerBlocks::publish(ObjectId object, const std::vector<TensorView>& tensors) {
  Publication pub;
  WireWriter blob;
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t>& used = published_[object.id];
  for (const TensorView& t : tensors) {
    const char* p = static_cast<const char*>(t.data());
    const Block* b = block_of(p, t.nbytes());
    if (b != nullptr) {
      pub.places.emplace_back(kInBlock, static_cast<uint64_t>(p - b->base));
      blob.u64(b->id).u64(b->size);
      used.push_back(b->id);
      ++publications_[b->id];
    } else {
      pub.places.emplace_back(kInProcess, reinterpret_cast<uint64_t>(p));
      blob.u64(0).u64(0);
    }
  }
  pub.blob = std::move(blob.out());
  return pub;
}

void OwnerBlocks::unpublish(ObjectId object) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = published_.find(object.id);
  if (it == published_.end()) return;
  for (uint64_t block : it->second) {
    auto p = publications_.find(block);
    if (p != publications_.end() && --p->second == 0) publications_.erase(p);
  }
  published_.erase(it);
}

std::string OwnerBlocks::answer(uint64_t id, std::vector<int>* fds) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) {
    throw Error(ErrorCode::kInvalidUsage,
                "shm transport: shareable block " + std::to_string(id) + " was deallocated");
  }
  if (publications_.count(id) == 0) {
    throw Error(ErrorCode::kInvalidUsage, "shm transport: shareable block " + std::to_string(id) +
                                              " holds no published object");
  }
  const Block& b = blocks_.at(it->second);
  const int fd = ::fcntl(b.fd >= 0 ? b.fd : b.memory.fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    throw Error(ErrorCode::kIoError, std::string("shm transport: dup: ") + std::strerror(errno));
  }
  fds->push_back(fd);
  if (table_.fd() >= 0) {
    const int table = ::fcntl(table_.fd(), F_DUPFD_CLOEXEC, 0);
    if (table >= 0) fds->push_back(table);  // without it the consumer only caches by count
  }
  return block_reply({b.offset, b.size, b.slot});
}

const OwnerBlocks::Block* OwnerBlocks::block_of(const char* p, size_t bytes) const {
  auto it = blocks_.upper_bound(const_cast<char*>(p));
  if (it == blocks_.begin()) return nullptr;
  --it;
  const Block& b = it->second;
  return p >= b.base && p + bytes <= b.base + b.size ? &b : nullptr;
}

// Gives a block a slot in the table of live blocks (made with the first block), if one is free.
void OwnerBlocks::list_locked(Block& b) {
  if (!table_tried_) {
    table_tried_ = true;
    try {
      table_ = detail::SharedMemory::create("tutti-rdt-blocks", kTableBytes,
                                            "shm transport: the table of live blocks");
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("shm transport: no table of live blocks: {}", e.what());
    }
  }
  if (table_.data() == nullptr) return;
  if (!free_slots_.empty()) {
    b.slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (next_slot_ < static_cast<int64_t>(kTableEntries)) {
    b.slot = next_slot_++;
  } else {
    return;  // full: consumers keep this block mapped by count only
  }
  table_words(table_)[b.slot].store(b.id, std::memory_order_release);
}

void OwnerBlocks::unlist_locked(const Block& b) {
  if (table_.data() == nullptr || b.slot <= 0) return;
  table_words(table_)[b.slot].store(0, std::memory_order_release);
  table_words(table_)[0].fetch_add(1, std::memory_order_acq_rel);
  free_slots_.push_back(b.slot);
}

void OwnerBlocks::forget_locked(std::map<char*, Block>::iterator it) {
  if (it->second.fd >= 0) ::close(it->second.fd);
  unlist_locked(it->second);
  by_id_.erase(it->second.id);
  blocks_.erase(it);  // an allocation's memory is unmapped and closed with it
}

}  // namespace tutti::shm_backend
