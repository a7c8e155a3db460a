#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "tutti/error.h"
#include "util/hash.h"
#include "util/host_identity.h"
#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

[[noreturn]] void throw_errno(const std::string& what) {
  throw Error(ErrorCode::kIoError, "shm: " + what + ": " + std::strerror(errno));
}

// The job's and group's identity (long ones shortened with a hash).
std::string segment_base(const std::string& instance) {
  if (instance.size() <= 180) return instance;
  return instance.substr(0, 160) + "-" +
         std::to_string(detail::Fnv1a().mix(std::hash<std::string>()(instance)).value());
}

constexpr size_t kSuffixLength = 9;  // "-%08x"

// "/tutti-seg-<uid>-n<ns>-<pid>-<base>-<suffix>": the maker, so that a segment whose every rank
// was killed in the set-up can be swept by the next group's (sweep_dead_files), and a random
// suffix, so two jobs without job ids, using one group name on one host, never collide.
std::string segment_name(const std::string& instance) {
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "-%08x", rd());
  return "/" + own_file_prefix("seg") + std::to_string(::getpid()) + "-" + segment_base(instance) +
         suffix;
}

}  // namespace

std::string own_file_prefix(const char* kind) {
  return std::string("tutti-") + kind + "-" + std::to_string(::getuid()) + "-n" +
         std::to_string(detail::pid_namespace()) + "-";
}

void sweep_dead_files(const char* kind) {
  if (detail::pid_namespace() == 0) return;
  const std::string prefix = own_file_prefix(kind);
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid > 0 && *end == '-' && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::shm_unlink(("/" + name).c_str());
      TUTTI_LOG_DEBUG("shm: removed /dev/shm/{}, left by process {}, which is gone", name, pid);
    }
  }
  ::closedir(d);
}

void remove_segments_of(const std::string& instance) {
  // The instance names one incarnation of one group on this host: a segment name of any maker
  // (its uid, namespace and pid, three fields) with its base and a suffix is this incarnation's,
  // made by a rank whose set-up failed or died.
  const std::string base = segment_base(instance);
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    const std::string n = e->d_name;
    if (n.rfind("tutti-seg-", 0) != 0) continue;
    size_t at = std::string("tutti-seg-").size();
    for (int field = 0; field < 3 && at != std::string::npos; ++field) {
      at = n.find('-', at);
      if (at != std::string::npos) ++at;
    }
    if (at == std::string::npos || n.size() != at + base.size() + kSuffixLength ||
        n.compare(at, base.size(), base) != 0 || n[at + base.size()] != '-' ||
        n.find_first_not_of("0123456789abcdef", at + base.size() + 1) != std::string::npos) {
      continue;
    }
    ::shm_unlink(("/" + n).c_str());
  }
  ::closedir(dir);
}

int reserve_file(int fd, size_t len) {
  // 2 MiB takes ~0.2-0.5 ms here. An interrupted piece is tried again at half its size (down to
  // a page, a few microseconds), so that signals however frequent cannot stop the reservation.
  constexpr size_t kMaxPiece = size_t{2} << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t piece = kMaxPiece;
  for (size_t off = 0; off < len;) {
    const size_t n = std::min(piece, len - off);
    const int err = ::posix_fallocate(fd, static_cast<off_t>(off), static_cast<off_t>(n));
    if (err == EINTR) {
      piece = std::max(page, piece / 2);
      continue;
    }
    if (err != 0) return err;
    off += n;
    piece = std::min(kMaxPiece, piece * 2);
  }
  return 0;
}

int populate_pages(void* addr, size_t len) {
#ifdef MADV_POPULATE_WRITE
  constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
  constexpr int kPopulateWrite = 23;  // Linux 5.14's
#endif
  return ::madvise(addr, len, kPopulateWrite) == 0 ? 0 : errno;
}

ShmSegment::ShmSegment(Store& store, const std::string& instance, int rank, int parties,
                       size_t bytes, size_t reserve, const std::string& layout)
    : size_(bytes) {
  std::string name;
  int fd = -1;
  if (rank == 0) {
    sweep_dead_files("seg");
    name = segment_name(instance);
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw_errno("creating segment '" + name + "'");
    if (::ftruncate(fd, static_cast<off_t>(size_)) != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw_errno("sizing segment '" + name + "' to " + std::to_string(size_) + " bytes");
    }
    // Reserved now: tmpfs grows a file's pages on first touch, and a page /dev/shm has no room
    // for then kills the process that touches it (SIGBUS), in the middle of some later op.
    // The collectives' part only: the mailboxes (w x w of them) are populated on first use.
    if (const int err = reserve_file(fd, std::min(reserve, size_)); err != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw Error(no_room(err) ? ErrorCode::kUnavailable : ErrorCode::kIoError,
                  "shm: reserving the group's segment of " + std::to_string(reserve) +
                      " bytes in /dev/shm: " + std::strerror(err) +
                      (no_room(err) ? " (give /dev/shm more room, e.g. docker's --shm-size, "
                                      "or lower TUTTI_SHM_CHUNK_BYTES / TUTTI_SHM_MAILBOX_BYTES)"
                                    : ""));
    }
    store.set("shm/segment", name + "\n" + layout);
  } else {
    // "<name>\n<layout>": names never hold a newline.
    const std::string published = store.get("shm/segment");
    const size_t cut = published.find('\n');
    name = published.substr(0, cut);
    if (cut == std::string::npos) {
      // Builds before the layout's check publish the name alone.
      throw Error(ErrorCode::kRemoteError,
                  "shm: rank 0 published the group's segment '" + name +
                      "' without its layout: it runs a tutti build older than rank " +
                      std::to_string(rank) + "'s (every rank of a group needs the same build)");
    }
    const std::string theirs = published.substr(cut + 1);
    if (theirs != layout) {
      throw Error(ErrorCode::kRemoteError,
                  "shm: rank 0 lays the group's segment '" + name + "' out as [" + theirs +
                      "], rank " + std::to_string(rank) + " as [" + layout +
                      "] (ranks of different tutti builds, or disagreeing on "
                      "TUTTI_SHM_CHUNK_BYTES or TUTTI_SHM_MAILBOX_BYTES)");
    }
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      throw_errno("opening segment '" + name +
                  "' (gone: another rank's set-up failed and removed it, or this rank's /dev/shm "
                  "is not the others')");
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size_) {
      ::close(fd);
      throw Error(ErrorCode::kRemoteError,
                  "shm: segment '" + name + "' has " + std::to_string(st.st_size) +
                      " bytes, this rank expects " + std::to_string(size_) +
                      " (ranks disagree on TUTTI_SHM_CHUNK_BYTES or TUTTI_SHM_MAILBOX_BYTES)");
    }
  }
  // Not MAP_POPULATE: it would fault in the mailboxes too, as far as /dev/shm has room, and take
  // the room other files there need (whose first touch then dies of SIGBUS). The reserved part's
  // pages are mapped now; the mailboxes' on first use (ShmBackend::ensure_mailbox).
  base_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (rank == 0) ::shm_unlink(name.c_str());
    throw_errno("mapping segment '" + name + "'");
  }
  reserve = std::min(reserve, size_);
  if (populate_pages(base_, reserve) != 0) {
    // A kernel before 5.14: a read of each page maps it (rank 0 allocated them all).
    const long page = ::sysconf(_SC_PAGESIZE);
    const volatile char* p = static_cast<const volatile char*>(base_);
    for (size_t off = 0; off < reserve; off += static_cast<size_t>(page)) (void)p[off];
  }
  name_ = std::move(name);
  TUTTI_LOG_DEBUG("shm: rank {}/{} attached '{}' ({} bytes)", rank, parties, name_, size_);
}

void ShmSegment::unlink_name() {
  // Another rank may have taken it away already (ENOENT): the random suffix means no other
  // segment has the name since.
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  name_.clear();
}

ShmSegment::~ShmSegment() {
  unlink_name();
  if (base_ != nullptr) ::munmap(base_, size_);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)) {
  other.name_.clear();
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    unlink_name();
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    other.name_.clear();
  }
  return *this;
}

}  // namespace tutti::shm_backend
