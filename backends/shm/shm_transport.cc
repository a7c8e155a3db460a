// The "shm" tensor transport of the direct transport (tutti/transfer_agent.h): consumers on the
// owner's host read the owner's memory themselves.
// - Tensors in the agent's shareable memory (TransferAgent::allocate: one sealed-size memfd per
//   allocation): the consumer maps the memfd (once: mappings are cached), then copies from it, or
//   borrows views of it (zero-copy). The owner keeps a table of its live blocks, which consumers
//   map with their first block; at each get a consumer drops its cached mappings of blocks the
//   owner has deallocated since (a snapshot's block, for one), so their memory goes back.
// - Any other CPU tensor: one copy by cross-memory read (process_vm_readv) from the owner's
//   address space; where the kernel refuses it (another user, Yama), the owner streams the bytes
//   over the agents' Unix socket instead.
// The agent's lease keeps the owner from freeing an object while a consumer reads it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "shm_messages.h"
#include "util/logging.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"

namespace tutti::shm_backend {
namespace {

constexpr uint16_t kInArena = 1;  // place: (kInArena, offset in the chunk); the blob names it
constexpr uint16_t kInProcess = 2;  // place: (kInProcess, virtual address in the owner)
// A long copy looks at cancel and its deadline between slices. Large, because memcpy streams
// (non-temporal stores) only above a size tied to the cache (~100 MiB on a 260 MiB L3): smaller
// slices of a huge copy ran at half a plain memcpy's speed. At >= 5 GB/s a slice takes <= 50 ms.
constexpr size_t kCopySlice = 256u << 20;
constexpr size_t kMappingCache = 64;     // owner chunks a consumer keeps mapped
// The owner's table of live blocks: each block it lists has a slot of its own (1..kTableEntries-1,
// reused once free) holding the block's id while it lives, 0 after; word 0 counts deallocations,
// so a consumer looks at its mappings only when it changed. Blocks past the table's size (or
// made before a table could be) get no slot: consumers keep those mapped by count only.
constexpr size_t kTableEntries = 1u << 16;
constexpr size_t kTableBytes = kTableEntries * sizeof(uint64_t);

void put64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get64(const std::string& in, size_t at) {
  if (at + 8 > in.size()) {
    throw Error(ErrorCode::kInvalidArgument, "shm transport: the ref's transport bytes are truncated");
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

size_t page_round(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

// One of the owner's shareable allocations, or memory the application registered with its file.
struct Chunk {
  uint64_t id = 0;
  int fd = -1;  // registered memory: a read-only descriptor of the application's file
  char* base = nullptr;
  size_t size = 0;
  bool registered = false;  // the application's memory (not unmapped here)
  uint64_t offset = 0;      // where in the file `base` lies
  int64_t slot = 0;         // in the table of live blocks; 0: none
};

// A consumer's read-only mapping of an owner's chunk.
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
  }
};

// An owner's table of live blocks, mapped read-only by a consumer.
struct TableView {
  const std::atomic<uint64_t>* entries = nullptr;
  ~TableView() {
    if (entries != nullptr) ::munmap(const_cast<std::atomic<uint64_t>*>(entries), kTableBytes);
  }
  // True unless the owner listed `block` in `slot` and it is gone since (no slot: not listed).
  bool live(int64_t slot, uint64_t block) const {
    return slot <= 0 || slot >= static_cast<int64_t>(kTableEntries) ||
           entries[slot].load(std::memory_order_acquire) == block;
  }
  uint64_t deallocations() const { return entries[0].load(std::memory_order_acquire); }
  uint64_t seen = 0;  // deallocations() when the consumer last looked (under its cache lock)
};

// A memfd of `size` bytes, mapped read-write here, that consumers handed the descriptor can map
// read-only only: its size is sealed (a consumer's mapping never loses its pages to a shrink),
// and so, once mapped here, is writing (F_SEAL_FUTURE_WRITE, Linux 5.1+; older kernels keep the
// size seals only). Errors name the `asked` bytes.
std::pair<int, char*> sealed_memory(const char* name, size_t size, size_t asked) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int saved = errno;
    if (fd >= 0) ::close(fd);
    throw Error(saved == ENOMEM || saved == ENOSPC ? ErrorCode::kUnavailable : ErrorCode::kIoError,
                "shm transport: allocating " + std::to_string(asked) +
                    " shareable bytes: " + std::strerror(saved));
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    ::close(fd);
    throw Error(ErrorCode::kUnavailable, "shm transport: mapping " + std::to_string(size) +
                                             " bytes: " + std::strerror(saved));
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    TUTTI_LOG_DEBUG("shm transport: F_SEAL_FUTURE_WRITE: {}", std::strerror(errno));
  }
  return {fd, static_cast<char*>(p)};
}

void copy_sliced(char* dst, const char* src, size_t bytes, const FetchRequest& request,
                 const std::string& what) {
  for (size_t done = 0; done < bytes;) {
    if (request.cancelled.load()) throw Error(ErrorCode::kAborted, what + ": cancelled");
    if (std::chrono::steady_clock::now() >= request.deadline) {
      throw Error(ErrorCode::kTimeout, what + ": the copy ran past the deadline");
    }
    const size_t n = std::min(kCopySlice, bytes - done);
    std::memcpy(dst + done, src + done, n);
    done += n;
  }
}

class ShmTransport final : public TensorTransport {
 public:
  explicit ShmTransport(const TransportContext& ctx) : me_(ctx.agent) {}

  ~ShmTransport() override {
    for (auto& [base, c] : chunks_) {
      if (!c.registered) ::munmap(c.base, c.size);
      ::close(c.fd);
    }
    if (table_ != nullptr) ::munmap(table_, kTableBytes);
    if (table_fd_ >= 0) ::close(table_fd_);
  }

  const char* name() const override { return "shm"; }
  TransportTraits traits() const override { return {true, true, false}; }

  // ---- owner ----

  TensorView allocate(size_t bytes, DType dtype) override {
    Chunk c;
    c.size = page_round(bytes);
    const auto [fd, p] = sealed_memory("tutti-rdt", c.size, bytes);
    c.fd = fd;
    c.base = p;
    std::lock_guard<std::mutex> lock(mutex_);
    c.id = ++next_chunk_;
    list_locked(c);
    chunks_[c.base] = c;
    by_id_[c.id] = c.base;
    return TensorView(c.base, dtype, {static_cast<int64_t>(bytes / dtype_size(dtype))});
  }

  void deallocate(const TensorView& memory) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = chunks_.find(static_cast<char*>(memory.data()));
    if (it == chunks_.end() || it->second.registered) {
      throw Error(ErrorCode::kInvalidArgument,
                  "shm transport: " + memory.str() + " is not the start of an allocate()d block");
    }
    ::munmap(it->second.base, it->second.size);
    ::close(it->second.fd);
    unlist_locked(it->second);
    by_id_.erase(it->second.id);
    chunks_.erase(it);
  }

  bool owns(const TensorView& memory) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = chunks_.find(static_cast<char*>(memory.data()));
    return it != chunks_.end() && !it->second.registered;
  }

  void register_memory(const TensorView& region, int fd, uint64_t fd_offset) override {
    char* base = static_cast<char*>(region.data());
    const size_t bytes = region.nbytes();
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = chunks_.lower_bound(base);
    const bool overlaps = (next != chunks_.end() && next->first < base + bytes) ||
                          (next != chunks_.begin() &&
                           std::prev(next)->second.base + std::prev(next)->second.size > base);
    if (overlaps || plain_.count(base) != 0) {
      throw Error(ErrorCode::kInvalidArgument,
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
      throw Error(ErrorCode::kInvalidArgument,
                  "shm transport: descriptor " + std::to_string(fd) + " is not a file holding " +
                      std::to_string(bytes) + " bytes at offset " + std::to_string(fd_offset));
    }
    // Consumers get a read-only descriptor: they cannot map the application's memory writable.
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const int ro = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (ro < 0) {
      throw Error(ErrorCode::kInvalidArgument, "shm transport: reopening descriptor " +
                                                   std::to_string(fd) + " read-only: " +
                                                   std::strerror(errno));
    }
    Chunk c;
    c.id = ++next_chunk_;
    c.fd = ro;
    c.base = base;
    c.size = bytes;
    c.registered = true;
    c.offset = fd_offset;
    list_locked(c);
    chunks_[base] = c;
    by_id_[c.id] = base;
  }

  void unregister_memory(const TensorView& region) override {
    char* base = static_cast<char*>(region.data());
    std::lock_guard<std::mutex> lock(mutex_);
    if (plain_.erase(base) != 0) return;
    auto it = chunks_.find(base);
    if (it == chunks_.end() || !it->second.registered) {
      throw Error(ErrorCode::kInvalidArgument,
                  "shm transport: " + region.str() + " is not the start of registered memory");
    }
    ::close(it->second.fd);
    unlist_locked(it->second);
    by_id_.erase(it->second.id);
    chunks_.erase(it);
  }

  Publication publish(const PublishRequest& request) override {
    Publication pub;
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<uint64_t>& used = published_[request.object.id];
    for (const TensorView& t : request.tensors) {
      const Chunk* c = chunk_of(static_cast<const char*>(t.data()), t.nbytes());
      if (c != nullptr) {
        pub.places.emplace_back(kInArena, static_cast<uint64_t>(static_cast<const char*>(t.data()) - c->base));
        put64(pub.blob, c->id);
        put64(pub.blob, c->size);
        used.push_back(c->id);
        ++publications_[c->id];
      } else {
        pub.places.emplace_back(kInProcess, reinterpret_cast<uint64_t>(t.data()));
        put64(pub.blob, 0);
        put64(pub.blob, 0);
      }
    }
    return pub;
  }

  void unpublish(ObjectId object) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = published_.find(object.id);
    if (it == published_.end()) return;
    for (uint64_t chunk : it->second) {
      auto p = publications_.find(chunk);
      if (p != publications_.end() && --p->second == 0) publications_.erase(p);
    }
    published_.erase(it);
  }

  // "chunk <id>": the memfd of a block a live object publishes, to a consumer of this user on
  // this host (the agent checked both when it accepted the connection), and the table of live
  // blocks. Both sealed: read-only there.
  std::string answer(const std::string& request, const AgentIdentity& consumer,
                     std::vector<int>* fds) override {
    uint64_t id = 0;
    if (!parse_chunk_request(request, id)) {
      throw Error(ErrorCode::kInvalidArgument, "shm transport: unknown request '" +
                                                   request.substr(0, 32) + "'");
    }
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
    const Chunk& c = chunks_[it->second];
    const int fd = ::fcntl(c.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw Error(ErrorCode::kIoError, std::string("shm transport: dup: ") + std::strerror(errno));
    fds->push_back(fd);
    if (table_fd_ >= 0) {
      const int table = ::fcntl(table_fd_, F_DUPFD_CLOEXEC, 0);
      if (table >= 0) fds->push_back(table);  // without it the consumer only caches by count
    }
    (void)consumer;
    return chunk_reply(c.offset, c.size, static_cast<int64_t>(c.slot));
  }

  // ---- consumer ----

  FetchResult fetch(const FetchRequest& request) override {
    const TensorRef& ref = request.ref;
    const auto& metas = ref.tensors();
    const auto& places = ref.places();
    FetchResult out;
    std::vector<std::shared_ptr<Mapping>> keep;
    std::vector<std::pair<const char*, size_t>> sources(metas.size(), {nullptr, 0});
    for (size_t i = 0; i < metas.size(); ++i) {
      const uint64_t bytes = metas[i].nbytes();
      if (places[i].first == kInArena) {
        const uint64_t chunk = get64(ref.blob(), i * 16);
        auto m = mapping(request, chunk);
        // Against the block as mapped (its real size), never the ref's word for it.
        if (bytes > m->size || places[i].second > m->size - bytes) {
          throw Error(ErrorCode::kInvalidArgument,
                      "shm transport: tensor " + std::to_string(i) + " (" + std::to_string(bytes) +
                          " bytes at offset " + std::to_string(places[i].second) +
                          ") lies past the end of block " + std::to_string(chunk) + " (" +
                          std::to_string(m->size) + " bytes)");
        }
        sources[i] = {static_cast<const char*>(m->base) + places[i].second, bytes};
        keep.push_back(std::move(m));
      } else if (places[i].first != kInProcess) {
        throw Error(ErrorCode::kInvalidArgument, "shm transport: tensor " + std::to_string(i) +
                                                     " has an unknown place " +
                                                     std::to_string(places[i].first));
      }
    }
    if (request.borrow) {
      // Zero-copy where the tensor lies in a shared block; a private copy elsewhere.
      auto storage = std::make_shared<std::vector<std::shared_ptr<void>>>();
      std::vector<TensorView> copies_into;
      std::vector<size_t> copied;
      for (size_t i = 0; i < metas.size(); ++i) {
        const TensorMeta& m = metas[i];
        if (sources[i].first != nullptr) {
          out.views.emplace_back(const_cast<char*>(sources[i].first), m.dtype, m.shape, Device::cpu());
        } else {
          void* p = ::operator new(std::max<size_t>(m.nbytes(), 1));
          storage->emplace_back(p, [](void* q) { ::operator delete(q); });
          out.views.emplace_back(p, m.dtype, m.shape, Device::cpu());
          copies_into.push_back(out.views.back());
          copied.push_back(i);
        }
      }
      read_remote(request, copied, copies_into);
      out.keep = std::make_shared<std::pair<decltype(keep), decltype(storage)>>(std::move(keep),
                                                                               std::move(storage));
      return out;
    }
    std::vector<size_t> remote;
    std::vector<TensorView> remote_into;
    for (size_t i = 0; i < metas.size(); ++i) {
      if (sources[i].first != nullptr) {
        copy_sliced(static_cast<char*>(request.targets[i].data()), sources[i].first, sources[i].second,
                    request, "shm transport: copying tensor " + std::to_string(i));
      } else {
        remote.push_back(i);
        remote_into.push_back(request.targets[i]);
      }
    }
    read_remote(request, remote, remote_into);
    return out;
  }

 private:
  const Chunk* chunk_of(const char* p, size_t bytes) const {
    auto it = chunks_.upper_bound(const_cast<char*>(p));
    if (it == chunks_.begin()) return nullptr;
    --it;
    const Chunk& c = it->second;
    return p >= c.base && p + bytes <= c.base + c.size ? &c : nullptr;
  }

  // Gives a block a slot in the table of live blocks (made with the first block), if one is free.
  void list_locked(Chunk& c) {
    if (table_ == nullptr) make_table_locked();
    if (table_ == nullptr) return;
    if (!free_slots_.empty()) {
      c.slot = free_slots_.back();
      free_slots_.pop_back();
    } else if (next_slot_ < static_cast<int64_t>(kTableEntries)) {
      c.slot = next_slot_++;
    } else {
      return;  // full: consumers keep this block mapped by count only
    }
    table_[c.slot].store(c.id, std::memory_order_release);
  }

  void unlist_locked(const Chunk& c) {
    if (table_ == nullptr || c.slot <= 0) return;
    table_[c.slot].store(0, std::memory_order_release);
    table_[0].fetch_add(1, std::memory_order_acq_rel);
    free_slots_.push_back(c.slot);
  }

  void make_table_locked() {
    try {
      const auto [fd, p] = sealed_memory("tutti-rdt-blocks", kTableBytes, kTableBytes);
      table_ = reinterpret_cast<std::atomic<uint64_t>*>(p);
      table_fd_ = fd;
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("shm transport: no table of live blocks: {}", e.what());
    }
  }

  // Drops cached mappings of blocks their owners have deallocated (borrowed views keep theirs);
  // nothing to look at while no owner has deallocated a block since the last look.
  void sweep_locked() {
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
      const Cached& c = it->second;
      if (c.table && !c.table->live(c.slot, it->first.second)) {
        lru_.erase(c.position);
        it = cache_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The consumer's view of an owner's table of live blocks, mapped from `fd` (taken) unless it
  // already is.
  std::shared_ptr<TableView> table_of(const std::array<uint8_t, 16>& owner, int fd) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    for (auto it = tables_.begin(); it != tables_.end();) {
      it = it->second.expired() && it->first != owner ? tables_.erase(it) : std::next(it);
    }
    auto& known = tables_[owner];
    if (auto t = known.lock()) {
      ::close(fd);
      return t;
    }
    struct stat st;
    void* p = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kTableBytes)) {
      p = ::mmap(nullptr, kTableBytes, PROT_READ, MAP_SHARED, fd, 0);
    }
    ::close(fd);
    if (p == MAP_FAILED) return nullptr;
    auto t = std::make_shared<TableView>();
    t->entries = static_cast<const std::atomic<uint64_t>*>(p);
    t->seen = t->deallocations();
    known = t;
    return t;
  }

  std::shared_ptr<Mapping> mapping(const FetchRequest& request, uint64_t chunk) {
    const Key key{request.owner.owner().uuid, chunk};
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      sweep_locked();
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.position);
        return it->second.mapping;
      }
    }
    std::vector<int> fds;
    const std::string reply = request.owner.call(chunk_request(chunk), &fds);
    uint64_t at = 0, bytes = 0;
    int64_t slot = 0;
    const bool parsed = parse_chunk_reply(reply, at, bytes, slot);
    if (fds.empty()) {
      throw Error(ErrorCode::kInternal, "shm transport: the owner sent no descriptor for block " +
                                            std::to_string(chunk));
    }
    for (size_t i = 2; i < fds.size(); ++i) ::close(fds[i]);
    std::shared_ptr<TableView> table = fds.size() > 1 ? table_of(key.first, fds[1]) : nullptr;
    // The block must lie inside the file as it is (a shorter file would fault the reader).
    struct stat st;
    if (!parsed || ::fstat(fds[0], &st) != 0 || st.st_size < 0 ||
        at > static_cast<uint64_t>(st.st_size) || bytes > static_cast<uint64_t>(st.st_size) - at) {
      ::close(fds[0]);
      throw Error(ErrorCode::kIoError, "shm transport: the owner's block " + std::to_string(chunk) +
                                           " does not lie inside its file ('" +
                                           reply.substr(0, 64) + "')");
    }
    const off_t offset = static_cast<off_t>(at);
    const size_t size = static_cast<size_t>(bytes);
    auto m = std::make_shared<Mapping>();
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fds[0], offset);
    const int saved = errno;
    ::close(fds[0]);
    if (p == MAP_FAILED) {
      throw Error(ErrorCode::kIoError, "shm transport: mapping the owner's block " +
                                           std::to_string(chunk) + ": " + std::strerror(saved));
    }
    m->base = p;
    m->size = size;
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second.mapping;  // another get mapped it meanwhile
    lru_.push_front(key);
    cache_[key] = Cached{m, std::move(table), slot, lru_.begin()};
    while (cache_.size() > kMappingCache) {
      cache_.erase(lru_.back());  // borrowed views keep their own reference
      lru_.pop_back();
    }
    return m;
  }

  // Tensors outside shared blocks: a cross-memory read, or the owner streams them.
  void read_remote(const FetchRequest& request, const std::vector<size_t>& which,
                   const std::vector<TensorView>& into) {
    if (which.empty()) return;
    const auto& places = request.ref.places();
    const pid_t pid = static_cast<pid_t>(request.ref.owner().pid);
    bool refused = cma_refused_.load();
    for (size_t k = 0; k < which.size() && !refused; ++k) {
      char* dst = static_cast<char*>(into[k].data());
      const uint64_t address = places[which[k]].second;
      const size_t bytes = into[k].nbytes();
      for (size_t done = 0; done < bytes;) {
        if (request.cancelled.load()) throw Error(ErrorCode::kAborted, "shm transport: cancelled");
        if (std::chrono::steady_clock::now() >= request.deadline) {
          throw Error(ErrorCode::kTimeout, "shm transport: the copy ran past the deadline");
        }
        const size_t n = std::min(kCopySlice, bytes - done);
        iovec local{dst + done, n};
        iovec remote{reinterpret_cast<void*>(address + done), n};
        const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got > 0) {
          done += static_cast<size_t>(got);
          continue;
        }
        if (errno == EPERM || errno == ENOSYS) {
          if (!cma_refused_.exchange(true)) {
            TUTTI_LOG_INFO("shm transport: cross-memory reads from pid {} are refused ({}); the "
                           "owner streams such tensors over a Unix socket (put tensors from "
                           "TransferAgent::allocate for zero-copy)",
                           pid, std::strerror(errno));
          }
          refused = true;
          break;
        }
        if (errno == ESRCH) {
          throw Error(ErrorCode::kIoError, "shm transport: the owner (pid " + std::to_string(pid) +
                                               ") is gone: it exited or died");
        }
        throw Error(ErrorCode::kIoError, "shm transport: reading tensor " +
                                             std::to_string(which[k]) + " from pid " +
                                             std::to_string(pid) + ": " + std::strerror(errno));
      }
    }
    if (!refused) return;
    // The owner streams every tensor of the object: keep what this one needs.
    std::vector<std::shared_ptr<void>> scratch;
    std::vector<TensorView> all;
    size_t k = 0;
    for (size_t i = 0; i < request.ref.tensors().size(); ++i) {
      const TensorMeta& m = request.ref.tensors()[i];
      if (k < which.size() && which[k] == i) {
        all.push_back(into[k++]);
      } else {
        void* p = ::operator new(std::max<size_t>(m.nbytes(), 1));
        scratch.emplace_back(p, [](void* q) { ::operator delete(q); });
        all.emplace_back(p, m.dtype, m.shape, Device::cpu());
      }
    }
    request.owner.stream(all);
  }

  AgentIdentity me_;
  mutable std::mutex mutex_;
  std::map<char*, Chunk> chunks_;  // by base address
  std::map<uint64_t, char*> by_id_;
  std::map<uint64_t, std::vector<uint64_t>> published_;  // object id -> the blocks it publishes
  std::map<uint64_t, int> publications_;                  // block -> objects publishing it
  std::map<char*, size_t> plain_;  // registered without a file
  uint64_t next_chunk_ = 0;
  std::atomic<uint64_t>* table_ = nullptr;  // the live blocks (see kTableEntries)
  int table_fd_ = -1;
  std::vector<int64_t> free_slots_;
  int64_t next_slot_ = 1;  // slot 0 counts deallocations

  using Key = std::pair<std::array<uint8_t, 16>, uint64_t>;  // owner, block
  struct Cached {
    std::shared_ptr<Mapping> mapping;
    std::shared_ptr<TableView> table;  // its owner's live blocks; null from an owner without one
    int64_t slot = 0;                  // the block's slot there (0: not listed)
    std::list<Key>::iterator position;
  };
  std::mutex cache_mutex_;
  std::list<Key> lru_;
  std::map<Key, Cached> cache_;
  std::map<std::array<uint8_t, 16>, std::weak_ptr<TableView>> tables_;  // by owner
  std::atomic<bool> cma_refused_{false};
};

}  // namespace

void register_shm_transport() {
  register_tensor_transport("shm", [](const TransportContext& ctx) {
    return std::make_unique<ShmTransport>(ctx);
  });
}

}  // namespace tutti::shm_backend
