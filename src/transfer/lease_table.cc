#include "transfer/lease_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "tutti/error.h"

namespace tutti::detail {

SharedPages::SharedPages(const char* name, size_t bytes) : size_(bytes) {
  fd_ = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw Error(ErrorCode::kIoError, std::string("direct transport: shared memory for ") + name +
                                         ": " + why);
  }
  base_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base_ == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    base_ = nullptr;
    throw Error(ErrorCode::kIoError, std::string("direct transport: mapping ") + name + ": " + why);
  }
  // Its size is fixed, and nobody else may map it writable.
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE) != 0) {
    ::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);  // before Linux 5.1
  }
}

SharedPages SharedPages::map_read_only(int fd, size_t bytes) {
  SharedPages p;
  p.fd_ = fd;
  p.size_ = bytes;
  // A peer's pages must be the size this build expects, and sealed at it (a smaller or
  // shrinkable file would fault on access).
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "direct transport: a peer's shared pages are " + std::to_string(st.st_size) +
                    " bytes" + ((seals >= 0 && (seals & F_SEAL_SHRINK)) ? "" : ", not sealed") +
                    ", expected " + std::to_string(bytes) + " (another tutti version?)");
  }
  p.base_ = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p.base_ == MAP_FAILED) {
    p.base_ = nullptr;
    throw Error(ErrorCode::kIoError,
                std::string("direct transport: mapping a peer's pages: ") + std::strerror(errno));
  }
  return p;
}

SharedPages::~SharedPages() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

SharedPages::SharedPages(SharedPages&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedPages& SharedPages::operator=(SharedPages&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, size_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

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
