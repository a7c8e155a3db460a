#include "shm_symmetric.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "shm_messages.h"
#include "shm_segment.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

size_t page_size() {
  return static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

[[noreturn]] void fail(ErrorCode code, const std::string& what, int err) {
  throw Error(code, "shm symmetric memory: " + what + ": " + std::strerror(err));
}

void unmap(const SymmetricMapping& m) {
  if (m.base != nullptr) ::munmap(m.base, m.mapped());
}

// Removes this user's files of symmetric memory whose process is gone (a rank that died before
// the others learnt its file's name leaves it behind). Once per process.
void sweep_stale_files() {
  static std::once_flag once;
  std::call_once(once, [] { sweep_dead_files("sym"); });
}

}  // namespace

size_t SymmetricMapping::mapped() const {
  return bytes + page_size();
}

std::atomic<uint32_t>& SymmetricMapping::live() const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(base + bytes);
}

SymmetricTable::~SymmetricTable() {
  for (auto& [region, maps] : peers_) {
    for (const SymmetricMapping& m : maps) unmap(m);
  }
}

SymmetricPlace SymmetricTable::find(const void* p, size_t bytes) const {
  if (!any()) return {};
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = local_.upper_bound(c);
  if (it == local_.begin()) return {};
  --it;
  const size_t offset = static_cast<size_t>(c - it->first);
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return {};
  return {it->second.region, offset};
}

char* SymmetricTable::peer(int q, uint64_t region, uint64_t offset, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(region);
  if (it == peers_.end() || q < 0 || static_cast<size_t>(q) >= it->second.size()) return nullptr;
  const SymmetricMapping& m = it->second[static_cast<size_t>(q)];
  if (m.base == nullptr || offset > m.bytes || bytes > m.bytes - offset) return nullptr;
  return m.base + offset;
}

void SymmetricTable::add_local(uint64_t region, char* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  local_[base] = Local{region, bytes};
  locals_.store(static_cast<int>(local_.size()), std::memory_order_release);
}

void SymmetricTable::remove_local(uint64_t region) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = local_.begin(); it != local_.end(); ++it) {
    if (it->second.region == region) {
      local_.erase(it);
      locals_.store(static_cast<int>(local_.size()), std::memory_order_release);
      return;
    }
  }
}

void SymmetricTable::add_peers(uint64_t region, std::vector<SymmetricMapping> maps) {
  std::lock_guard<std::mutex> lock(mutex_);
  peers_[region] = std::move(maps);
}

void SymmetricTable::prune() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    bool left = false;
    for (SymmetricMapping& m : it->second) {
      if (m.base == nullptr) continue;
      if (m.live().load(std::memory_order_acquire) == 0) {
        unmap(m);
        m = SymmetricMapping{};
      } else {
        left = true;
      }
    }
    it = left ? std::next(it) : peers_.erase(it);
  }
}

size_t SymmetricTable::peer_mappings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [region, maps] : peers_) {
    for (const SymmetricMapping& m : maps) n += m.base != nullptr;
  }
  return n;
}

ShmRegion::ShmRegion(std::shared_ptr<SymmetricTable> table, size_t bytes)
    : table_(std::move(table)), bytes_(bytes) {
  sweep_stale_files();
  const size_t page = page_size();
  mine_.bytes = (bytes + page - 1) / page * page;
  static std::atomic<uint64_t> made{0};
  std::random_device rd;
  name_ = "/" + own_file_prefix("sym") + std::to_string(::getpid()) + "-" + std::to_string(++made) +
          "-" + std::to_string(rd());
  const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail(ErrorCode::kIoError, "creating '" + name_ + "'", errno);
  // Reserved now: tmpfs hands out pages at first touch, and a full /dev/shm would then end the
  // process that touches it (SIGBUS), here or in a peer.
  const int err = reserve_file(fd, mine_.mapped());
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(name_.c_str());
    fail(no_room(err) ? ErrorCode::kUnavailable : ErrorCode::kIoError,
         "reserving " + std::to_string(mine_.mapped()) + " bytes of /dev/shm for '" + name_ + "'",
         err);
  }
  void* p =
      ::mmap(nullptr, mine_.mapped(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name_.c_str());
    fail(ErrorCode::kUnavailable, "mapping " + std::to_string(mine_.mapped()) + " bytes", e);
  }
  mine_.base = static_cast<char*>(p);
  mine_.live().store(1, std::memory_order_release);
}

ShmRegion::~ShmRegion() {
  if (listed_) table_->remove_local(region_);
  if (!name_.empty()) unlink_names();  // never committed (an error on the way)
  for (const SymmetricMapping& m : maps_) unmap(m);
  if (mine_.base != nullptr) {
    mine_.live().store(0, std::memory_order_release);  // the peers drop theirs (prune)
    unmap(mine_);
  }
}

void ShmRegion::unlink_names() noexcept {
  for (const std::string& n : names_) ::shm_unlink(n.c_str());
  ::shm_unlink(name_.c_str());
  name_.clear();
}

std::string ShmRegion::descriptor() const {
  return symmetric_descriptor({mine_.bytes, name_});
}

void ShmRegion::attach(const std::vector<std::string>& descriptors) {
  // Numbered here, where every rank has every rank's descriptor: a rank whose exchange failed
  // before it (and so every rank's) numbers none.
  region_ = table_->next_region();
  const int me = table_->rank();
  if (descriptors.size() != static_cast<size_t>(table_->world_size())) {
    throw Error(ErrorCode::kInternal,
                "shm symmetric memory: " + std::to_string(descriptors.size()) +
                    " descriptors for " + std::to_string(table_->world_size()) + " ranks");
  }
  maps_.assign(descriptors.size(), SymmetricMapping{});
  for (size_t q = 0; q < descriptors.size(); ++q) {
    SymmetricDescriptor d;
    try {
      d = parse_symmetric_descriptor(descriptors[q]);
    } catch (const Error& e) {
      throw Error(ErrorCode::kRemoteError, "rank " + std::to_string(q) + ": " + e.what());
    }
    names_.push_back(d.name);
    if (d.bytes != mine_.bytes) {
      throw Error(ErrorCode::kRemoteError, "shm symmetric memory: rank " + std::to_string(q) +
                                               " made " + std::to_string(d.bytes) +
                                               " bytes where rank " + std::to_string(me) +
                                               " made " + std::to_string(mine_.bytes));
    }
    if (static_cast<int>(q) == me) continue;
    const int fd = ::shm_open(d.name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      fail(ErrorCode::kIoError, "opening rank " + std::to_string(q) + "'s '" + d.name + "'", errno);
    SymmetricMapping m;
    m.bytes = d.bytes;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != m.mapped()) {
      ::close(fd);
      throw Error(ErrorCode::kRemoteError, "shm symmetric memory: rank " + std::to_string(q) +
                                               "'s '" + d.name + "' is not " +
                                               std::to_string(m.mapped()) + " bytes");
    }
    void* p = ::mmap(nullptr, m.mapped(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      fail(ErrorCode::kUnavailable,
           "mapping rank " + std::to_string(q) + "'s " + std::to_string(m.mapped()) + " bytes", e);
    }
    m.base = static_cast<char*>(p);
    maps_[q] = m;
  }
}

void ShmRegion::commit(bool everyone) {
  // Every rank removes every name: one left behind needs every rank to die before this.
  unlink_names();
  if (!everyone) return;  // the peers' mappings go with this region
  table_->add_peers(region_, std::move(maps_));
  maps_.clear();
  table_->add_local(region_, mine_.base, bytes_);
  listed_ = true;
  TUTTI_LOG_DEBUG("shm: rank {} made symmetric region {} ({} bytes)", table_->rank(), region_,
                  bytes_);
}

}  // namespace tutti::shm_backend
