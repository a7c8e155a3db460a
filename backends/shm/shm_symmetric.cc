#include "shm_symmetric.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "shm_messages.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

size_t whole_pages(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

[[noreturn]] void fail(ErrorCode code, const std::string& what) {
  throw Error(code, "shm symmetric memory: " + what + ": " + std::strerror(errno));
}

}  // namespace

SymmetricTable::~SymmetricTable() {
  for (auto& [region, maps] : peers_) {
    for (auto& [p, bytes] : maps) {
      if (p != nullptr) ::munmap(p, bytes);
    }
  }
}

SymmetricPlace SymmetricTable::find(const void* p, size_t bytes) const {
  if (locals_.load(std::memory_order_acquire) == 0) return {};
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
  const auto& [p, mapped] = it->second[static_cast<size_t>(q)];
  if (p == nullptr || offset > mapped || bytes > mapped - offset) return nullptr;
  return p + offset;
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

void SymmetricTable::add_peers(uint64_t region, std::vector<std::pair<char*, size_t>> maps) {
  std::lock_guard<std::mutex> lock(mutex_);
  peers_[region] = std::move(maps);
}

ShmRegion::ShmRegion(std::shared_ptr<SymmetricTable> table, size_t bytes)
    : table_(std::move(table)), region_(table_->next_region()), bytes_(bytes) {
  mapped_ = whole_pages(bytes);
  std::random_device rd;
  name_ = "/tutti-sym-" + std::to_string(::getuid()) + "-" + std::to_string(::getpid()) + "-" +
          std::to_string(region_) + "-" + std::to_string(rd());
  const int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail(ErrorCode::kIoError, "creating '" + name_ + "'");
  if (::ftruncate(fd, static_cast<off_t>(mapped_)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name_.c_str());
    errno = e;
    fail(ErrorCode::kUnavailable,
         "sizing '" + name_ + "' to " + std::to_string(mapped_) + " bytes");
  }
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(name_.c_str());
    errno = e;
    fail(ErrorCode::kUnavailable, "mapping " + std::to_string(mapped_) + " bytes");
  }
  base_ = static_cast<char*>(p);
}

ShmRegion::~ShmRegion() {
  if (listed_) table_->remove_local(region_);
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  for (auto& [p, bytes] : maps_) {
    if (p != nullptr) ::munmap(p, bytes);
  }
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

std::string ShmRegion::descriptor() const {
  return symmetric_descriptor({region_, mapped_, name_});
}

void ShmRegion::attach(const std::vector<std::string>& descriptors) {
  const int me = table_->rank();
  if (descriptors.size() != static_cast<size_t>(table_->world_size())) {
    throw Error(ErrorCode::kInternal,
                "shm symmetric memory: " + std::to_string(descriptors.size()) +
                    " descriptors for " + std::to_string(table_->world_size()) + " ranks");
  }
  maps_.assign(descriptors.size(), {nullptr, 0});
  for (size_t q = 0; q < descriptors.size(); ++q) {
    SymmetricDescriptor d;
    try {
      d = parse_symmetric_descriptor(descriptors[q]);
    } catch (const Error& e) {
      throw Error(ErrorCode::kRemoteError, "rank " + std::to_string(q) + ": " + e.what());
    }
    const uint64_t region = d.region, bytes = d.bytes;
    const std::string& name = d.name;
    names_.push_back(name);
    if (region != region_ || bytes != mapped_) {
      throw Error(ErrorCode::kRemoteError,
                  "shm symmetric memory: rank " + std::to_string(q) + " made region " +
                      std::to_string(region) + " of " + std::to_string(bytes) +
                      " bytes where rank " + std::to_string(me) + " made region " +
                      std::to_string(region_) + " of " + std::to_string(mapped_));
    }
    if (static_cast<int>(q) == me) continue;
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      fail(ErrorCode::kIoError, "opening rank " + std::to_string(q) + "'s '" + name + "'");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
      ::close(fd);
      throw Error(ErrorCode::kRemoteError, "shm symmetric memory: rank " + std::to_string(q) +
                                               "'s '" + name + "' is not " + std::to_string(bytes) +
                                               " bytes");
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      errno = e;
      fail(ErrorCode::kUnavailable,
           "mapping rank " + std::to_string(q) + "'s " + std::to_string(bytes) + " bytes");
    }
    maps_[q] = {static_cast<char*>(p), bytes};
  }
}

void ShmRegion::commit(bool everyone) {
  // Every rank removes every name: one left behind needs every rank to die before this.
  for (const std::string& n : names_) ::shm_unlink(n.c_str());
  ::shm_unlink(name_.c_str());
  name_.clear();
  if (!everyone) return;  // the peers' mappings go with this region
  table_->add_peers(region_, std::move(maps_));
  maps_.clear();
  table_->add_local(region_, base_, bytes_);
  listed_ = true;
  TUTTI_LOG_DEBUG("shm: rank {} made symmetric region {} ({} bytes)", table_->rank(), region_,
                  bytes_);
}

}  // namespace tutti::shm_backend
