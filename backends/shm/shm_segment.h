// ShmSegment: one POSIX shared-memory mapping that the ranks of a group on one host share
// (internal to the shm backend).
//
// Rank 0 creates it under a name carrying its own pid (own_file_prefix("seg")), the group's
// identity and a random suffix, first sweeping the names of makers that are gone; it sizes it
// and publishes the name in the group's store; the others open it, checking its size. Each rank
// takes the name away (unlink_name) once the set-up knows every rank mapped it, or when its
// set-up fails (a segment not yet unlinked does so when it goes), so neither destroy nor a crash
// leaves it in /dev/shm: a set-up ends on every rank, by success or by a named error, when a
// rank dies in it. The collectives' part is reserved and mapped up front; first-touch faults stay
// out of the ops.
#pragma once

#include <cerrno>
#include <cstddef>
#include <string>

#include "tutti/store.h"

namespace tutti::shm_backend {

// Maps the pages of [addr, addr + len) now, allocating them in /dev/shm (MADV_POPULATE_WRITE):
// 0, or the errno (EINVAL on a kernel before 5.14; EFAULT or ENOMEM where /dev/shm has no room,
// where a first touch would have died of SIGBUS).
int populate_pages(void* addr, size_t len);

// posix_fallocate of [0, len) of `fd`, in pieces of up to 2 MiB, each tried again (smaller) when
// a signal interrupts it (tmpfs gives up a whole call at a pending signal, undoing what it
// allocated, and SA_RESTART does not restart it: a profiler's timer, an operator's SIGUSR1 to dump
// the flight recorder). 0, or the errno (ENOSPC, ENOMEM: /dev/shm or the cgroup has no room).
int reserve_file(int fd, size_t len);
// Whether reserve_file's errno says /dev/shm (or the cgroup) has no room: kUnavailable, with what
// to do, rather than kIoError.
inline bool no_room(int err) {
  return err == ENOSPC || err == ENOMEM;
}

// Removes from /dev/shm every segment name of group incarnation `instance` (BackendContext's):
// what a rank whose set-up failed does, since the group cannot be made then, and the rank that
// made the segment may be dead. Never throws.
void remove_segments_of(const std::string& instance);

// "tutti-<kind>-<uid>-n<pid namespace>-": the start of the names this user's processes of this
// pid namespace give their files in /dev/shm ("seg": a group's segment, "sym": symmetric
// memory); the maker's pid follows, then a '-'.
std::string own_file_prefix(const char* kind);
// Removes this user's files of `kind` whose maker (the pid in their name) is gone: a process
// killed before anyone took its file's name away leaves it behind. Only this pid namespace's: a
// pid means nothing in another (its process may be alive there); where the namespace cannot be
// told, none. Never throws.
void sweep_dead_files(const char* kind);

class ShmSegment {
 public:
  ShmSegment() = default;
  // Collective over `parties` ranks. Throws Error(kIoError) when the segment cannot be made,
  // kUnavailable when /dev/shm has no room for its first `reserve` bytes (reserved at once: the
  // rest, the point-to-point mailboxes, the backend populates on first use), kRemoteError when
  // the ranks disagree on its size or on `layout` (what lies where in it, in words: rank 0's is
  // published beside the segment's name and compared by every other rank before it opens it, so
  // that ranks of two builds, whose segments may be the same size, never read each other's words
  // at the wrong offsets).
  ShmSegment(Store& store, const std::string& instance, int rank, int parties, size_t bytes,
             size_t reserve, const std::string& layout);
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return size_; }
  // Removes the name from /dev/shm (once every rank has the segment mapped, or the set-up failed);
  // the mapping stays. Idempotent.
  void unlink_name();

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;  // until unlinked
};

}  // namespace tutti::shm_backend
