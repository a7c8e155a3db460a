// Memory shared between processes of one host through a memfd (internal): made and mapped
// read-write by one process, handed to others as a descriptor (SCM_RIGHTS), which map it
// read-only or copy-on-write. Used by the direct transport's lease pages and the shm transport's
// shareable blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tutti::detail {

class SharedMemory {
 public:
  // How a peer's memory is mapped.
  enum class Access {
    kReadOnly,     // MAP_SHARED, PROT_READ: the owner's later writes show
    kCopyOnWrite,  // MAP_PRIVATE, read-write: a page this process writes becomes its own copy
  };

  SharedMemory() = default;
  // `bytes` (> 0; mappings cover whole pages) of zeroed memory, named `name` for /proc (nothing
  // in the file system), mapped read-write here. Its size is sealed (no mapping loses its pages
  // to a shrink), and so, once mapped here, is writing through other mappings
  // (F_SEAL_FUTURE_WRITE, Linux 5.1+; older kernels keep the size seals only). Errors name
  // `what` and the bytes: kUnavailable when the system is out of memory, else kIoError.
  static SharedMemory create(const char* name, size_t bytes, const std::string& what);
  // Maps `bytes` at `offset` of another process's file `fd` (taken: closed here, also on
  // error). The range must lie inside the file; with `exact`, the file must be exactly
  // offset + bytes long and sealed against shrinking (memory whose layout both sides fix).
  // kInvalidArgument when it does not, kIoError when mmap fails; messages name `what`.
  static SharedMemory map(int fd, uint64_t offset, size_t bytes, Access access,
                          const std::string& what, bool exact = false);

  ~SharedMemory();
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // The memfd (create only; -1 for a mapping of a peer's memory, whose descriptor is closed).
  int fd() const { return fd_; }
  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  void* base_ = nullptr;
  size_t size_ = 0;
};

// `bytes` rounded up to whole pages (at least one).
size_t page_round(size_t bytes);

// A buffer to receive `bytes` into (at least 1 byte, 64-byte aligned), freed with its last
// reference. From 4 MiB it is 2 MiB-aligned anonymous memory that asks for transparent huge
// pages (Debian's kernels give them on request only), so a copy into its fresh pages faults once
// per 2 MiB instead of once per 4 KiB: 16,384 faults were most of a 64 MiB get's time. Where the
// kernel has none to give, the pages are ordinary ones. Such a buffer given back is kept
// (TUTTI_TRANSFER_KEEP_MB in all, default 256, process-wide) for the next of the same length,
// its pages already touched.
// kUnavailable when there is no memory.
std::shared_ptr<void> receive_buffer(size_t bytes);

// Buffers to receive one object's tensors into, `bytes[i]` each, as receive_buffer would give
// them, except that those under 4 MiB share one allocation (each 64-byte aligned in it): each
// keeps all of them alive. One get of a thousand 200 KB tensors then maps and faults one 200 MB
// buffer instead of a thousand, which malloc maps afresh each time; from 4 MiB in all, like
// any large buffer, it is kept for the next get of the same tensors (within
// TUTTI_TRANSFER_KEEP_MB). kUnavailable when there is no memory.
std::vector<std::shared_ptr<void>> receive_buffers(const std::vector<size_t>& bytes);

}  // namespace tutti::detail
