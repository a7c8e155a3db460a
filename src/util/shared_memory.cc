#include "util/shared_memory.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "tutti/error.h"

namespace tutti::detail {

size_t page_round(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

SharedMemory SharedMemory::create(const char* name, size_t bytes, const std::string& what) {
  SharedMemory m;
  const size_t size = bytes;
  m.fd_ = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m.fd_ < 0 || ::ftruncate(m.fd_, static_cast<off_t>(size)) != 0) {
    const int saved = errno;
    throw Error(saved == ENOMEM || saved == ENOSPC ? ErrorCode::kUnavailable : ErrorCode::kIoError,
                what + ": making " + std::to_string(bytes) +
                    " bytes of shared memory: " + std::strerror(saved));
  }
  ::fcntl(m.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_, 0);
  if (p == MAP_FAILED) {
    const int saved = errno;
    throw Error(saved == ENOMEM ? ErrorCode::kUnavailable : ErrorCode::kIoError,
                what + ": mapping " + std::to_string(size) +
                    " bytes of shared memory: " + std::strerror(saved));
  }
  m.base_ = p;
  m.size_ = size;
  // Nobody else may map it writable (a private mapping may still write its own copies).
  ::fcntl(m.fd_, F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
  return m;
}

SharedMemory SharedMemory::map(int fd, uint64_t offset, size_t bytes, Access access,
                               const std::string& what, bool exact) {
  SharedMemory m;
  m.fd_ = fd;  // closed by m's destructor on every error below
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                what + ": the descriptor is not a file (" + std::strerror(errno) + ")");
  }
  const uint64_t file = static_cast<uint64_t>(st.st_size);
  if (bytes == 0 || offset > file || bytes > file - offset) {
    throw Error(ErrorCode::kInvalidArgument,
                what + ": " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                    " do not lie inside the file (" + std::to_string(file) + " bytes)");
  }
  if (exact) {
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (file != offset + bytes || seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  what + ": the file is " + std::to_string(file) + " bytes" +
                      (seals >= 0 && (seals & F_SEAL_SHRINK) ? "" : ", not sealed") +
                      ", expected " + std::to_string(offset + bytes) + " (another tutti version?)");
    }
  }
  const bool private_copy = access == Access::kCopyOnWrite;
  void* p = ::mmap(nullptr, bytes, private_copy ? PROT_READ | PROT_WRITE : PROT_READ,
                   private_copy ? MAP_PRIVATE : MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    throw Error(ErrorCode::kIoError,
                what + ": mapping " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  ::close(std::exchange(m.fd_, -1));
  m.base_ = p;
  m.size_ = bytes;
  return m;
}

SharedMemory::~SharedMemory() {
  if (base_ != nullptr) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    this->~SharedMemory();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

namespace {

// Large receive buffers given back wait here for the next one of the same length, up to
// TUTTI_TRANSFER_KEEP_MB (default 256; 0: none kept) in all, the oldest going first. A fresh
// mapping costs a fault per 2 MiB on its first touch and, on a virtual machine, the hypervisor's
// own first touch of guest memory it never backed: 90-760 ms for the first 8-64 MiB gets of a size
// here (8 ms per MiB), and in Ray, where each step's objects are new, 66 and 192 ms for 8 and 16
// MiB tensors against 7-10 ms with warm memory. Repeated transfers of one shape (weights every
// step) then fault once.
constexpr size_t kHugePage = size_t{2} << 20;

class KeptBuffers;
KeptBuffers& kept_buffers();

class KeptBuffers {
 public:
  KeptBuffers() {
    const char* mb = std::getenv("TUTTI_TRANSFER_KEEP_MB");
    if (mb != nullptr && *mb != '\0')
      cap_ = static_cast<size_t>(std::strtoull(mb, nullptr, 10)) << 20;
    // A child forked while another thread holds the lock would wait for it forever.
    ::pthread_atfork([] { kept_buffers().mutex_.lock(); }, [] { kept_buffers().mutex_.unlock(); },
                     [] { kept_buffers().mutex_.unlock(); });
  }

  // The one given back last (its pages the likeliest still in cache).
  void* take(size_t len) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->second == len) {
        void* p = it->first;
        kept_.erase(std::next(it).base());
        total_ -= len;
        return p;
      }
    }
    return nullptr;
  }

  void give(void* p, size_t len) {
    std::vector<std::pair<void*, size_t>> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (len > cap_) {
        drop.emplace_back(p, len);
      } else {
        kept_.emplace_back(p, len);
        total_ += len;
        while (total_ > cap_) {
          drop.push_back(kept_.front());
          total_ -= kept_.front().second;
          kept_.pop_front();
        }
      }
    }
    for (const auto& [q, n] : drop) ::munmap(q, n);
  }

 private:
  friend KeptBuffers& kept_buffers();
  std::mutex mutex_;
  std::deque<std::pair<void*, size_t>> kept_;  // oldest first
  size_t total_ = 0;
  size_t cap_ = size_t{256} << 20;
};

KeptBuffers& kept_buffers() {
  static auto* kept = new KeptBuffers();  // never destroyed: buffers may go at exit
  return *kept;
}

// `len` bytes (a multiple of 2 MiB) of anonymous memory, 2 MiB-aligned, asking for huge pages.
void* map_huge(size_t len, size_t bytes) {
  void* raw =
      ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    throw Error(ErrorCode::kUnavailable, "cannot map " + std::to_string(bytes) +
                                             " bytes to receive into: " + std::strerror(errno));
  }
  // Keep the 2 MiB-aligned part; give the rest back.
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (at + kHugePage - 1) & ~(kHugePage - 1);
  if (start > at) ::munmap(raw, start - at);
  if (start - at < kHugePage)
    ::munmap(reinterpret_cast<void*>(start + len), kHugePage - (start - at));
  void* p = reinterpret_cast<void*>(start);
  ::madvise(p, len, MADV_HUGEPAGE);
  return p;
}

}  // namespace

std::shared_ptr<void> receive_buffer(size_t bytes) {
  if (bytes < 2 * kHugePage) {
    void* p = nullptr;
    try {
      p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kUnavailable,
                  "cannot allocate " + std::to_string(bytes) + " bytes to receive into");
    }
    return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(64)); });
  }
  const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = kept_buffers().take(len);
  if (p == nullptr) p = map_huge(len, bytes);
  return std::shared_ptr<void>(p, [len](void* q) { kept_buffers().give(q, len); });
}

std::vector<std::shared_ptr<void>> receive_buffers(const std::vector<size_t>& bytes) {
  constexpr size_t kAlign = 64;
  std::vector<std::shared_ptr<void>> out(bytes.size());
  std::vector<size_t> at(bytes.size(), SIZE_MAX);  // offsets in the shared one (SIZE_MAX: its own)
  size_t total = 0;
  size_t shared = 0;  // how many share it
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= 2 * kHugePage) continue;
    at[i] = total;
    total += (std::max<size_t>(bytes[i], 1) + kAlign - 1) / kAlign * kAlign;
    ++shared;  // (under 4 MiB each: the sum cannot wrap)
  }
  std::shared_ptr<void> block;
  if (shared > 1) block = receive_buffer(total);
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (block && at[i] != SIZE_MAX) {
      out[i] = std::shared_ptr<void>(block, static_cast<char*>(block.get()) + at[i]);
    } else {
      out[i] = receive_buffer(bytes[i]);
    }
  }
  return out;
}

}  // namespace tutti::detail
