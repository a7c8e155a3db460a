#include "tutti/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "store/store_util.h"
#include "util/deadline.h"

namespace tutti {
namespace {

// The log is a sequence of records: kind (1 byte: 'S' set, 'D' delete), key length (u32),
// key, value length (u32), value.
constexpr char kSet = 'S';
constexpr char kDelete = 'D';

[[noreturn]] void throw_io(const std::string& path, const char* what) {
  throw Error(ErrorCode::kIoError,
              "FileStore '" + path + "': " + what + " failed: " + std::strerror(errno));
}

void put_u32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}

}  // namespace

namespace detail {
struct FileStoreLog {
  std::mutex mutex;  // the threads of this process; flock(2) keeps other processes out
  std::map<std::string, std::string> cache;
  int64_t offset = 0;  // how far into the file `cache` has been replayed
};
}  // namespace detail

namespace {
// The logs of the files open in this process, by device and inode, so that a FileStore opened
// again (a group re-created through the same file) starts where the others got to instead of
// replaying the whole file; the last few files' logs are kept after their stores closed, for a
// group destroyed and created again (replaying a log that grows with every cycle made 1000
// cycles quadratic: 37 s, and past 160 s under AddressSanitizer).
constexpr size_t kKeptLogs = 4;

std::shared_ptr<detail::FileStoreLog> shared_log(const struct stat& st) {
  static std::mutex mutex;
  static auto* logs = new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<detail::FileStoreLog>>();
  static auto* kept = new std::vector<std::shared_ptr<detail::FileStoreLog>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*logs)[{st.st_dev, st.st_ino}];
  auto log = slot.lock();
  if (!log) {
    log = std::make_shared<detail::FileStoreLog>();
    slot = log;
  }
  kept->erase(std::remove(kept->begin(), kept->end(), log), kept->end());
  kept->push_back(log);
  if (kept->size() > kKeptLogs) kept->erase(kept->begin());
  for (auto it = logs->begin(); it != logs->end();) {  // forget files no longer open or kept
    it = it->second.expired() ? logs->erase(it) : std::next(it);
  }
  return log;
}
}  // namespace

// Holds the process-local mutex (threads) and the file lock (processes) for one operation.
class FileStore::Locked {
 public:
  explicit Locked(FileStore& store) : store_(store), guard_(store.log_->mutex) {
    while (::flock(store_.fd_, LOCK_EX) != 0) {
      if (errno != EINTR) throw_io(store_.path_, "flock");
    }
    store_.refresh_locked();
  }
  ~Locked() { ::flock(store_.fd_, LOCK_UN); }

 private:
  FileStore& store_;
  std::lock_guard<std::mutex> guard_;
};

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout)
    : Store(timeout), path_(std::move(path)) {
  // Never through a symbolic link: one planted at the path would send the store's records into
  // whatever file it names. Readable by its owner only: the records hold the ranks' addresses.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0 && errno == ELOOP) {
    throw Error(ErrorCode::kInvalidArgument,
                "FileStore '" + path_ +
                    "': is a symbolic link; refusing to follow it (give the "
                    "path of the file itself)");
  }
  if (fd_ < 0) throw_io(path_, "open");
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    errno = error;
    throw_io(path_, "fstat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(ErrorCode::kInvalidArgument, "FileStore '" + path_ + "': is not a regular file");
  }
  log_ = shared_log(st);
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::refresh_locked() {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_io(path_, "fstat");
  if (st.st_size < log_->offset) {
    // Shorter than what was replayed: truncated, or another file now has this inode.
    log_->cache.clear();
    log_->offset = 0;
  }
  if (st.st_size <= log_->offset) return;
  std::string buf(static_cast<size_t>(st.st_size - log_->offset), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, log_->offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_io(path_, "read");
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  auto read_u32 = [&](uint32_t& v) {
    if (pos + 4 > buf.size()) return false;
    std::memcpy(&v, buf.data() + pos, 4);
    pos += 4;
    return true;
  };
  while (pos < buf.size()) {
    const size_t start = pos;
    const char kind = buf[pos++];
    uint32_t klen = 0, vlen = 0;
    if (!read_u32(klen) || pos + klen > buf.size()) break;
    std::string key = buf.substr(pos, klen);
    pos += klen;
    if (!read_u32(vlen) || pos + vlen > buf.size()) {
      pos = start;
      break;
    }
    if (kind == kSet) {
      log_->cache[key] = buf.substr(pos, vlen);
    } else if (kind == kDelete) {
      log_->cache.erase(key);
    } else {
      throw Error(ErrorCode::kIoError, "FileStore '" + path_ + "': corrupt record at offset " +
                                           std::to_string(log_->offset + start));
    }
    pos += vlen;
  }
  log_->offset += static_cast<int64_t>(pos);
}

void FileStore::append_locked(char kind, const std::string& key, const std::string& value) {
  std::string rec;
  rec.reserve(9 + key.size() + value.size());
  rec.push_back(kind);
  put_u32(rec, static_cast<uint32_t>(key.size()));
  rec += key;
  put_u32(rec, static_cast<uint32_t>(value.size()));
  rec += value;
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t n = ::write(fd_, rec.data() + done, rec.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw_io(path_, "write");
    done += static_cast<size_t>(n);
  }
  refresh_locked();  // replays our own record (and nothing else: we hold the lock)
}

void FileStore::set(const std::string& key, const std::string& value) {
  Locked lock(*this);
  append_locked(kSet, key, value);
}

std::string FileStore::get(const std::string& key) {
  wait({key}, timeout());
  Locked lock(*this);
  auto it = log_->cache.find(key);
  if (it == log_->cache.end()) throw detail::store_timeout("FileStore", timeout(), {key});
  return it->second;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  Locked lock(*this);
  const auto& cache = log_->cache;
  auto it = cache.find(key);
  const int64_t value =
      detail::add_to_counter(key, it == cache.end() ? nullptr : &it->second, delta);
  append_locked(kSet, key, std::to_string(value));
  return value;
}

std::string FileStore::compare_set(const std::string& key, const std::string& expected,
                                   const std::string& desired) {
  Locked lock(*this);
  auto it = log_->cache.find(key);
  if (it == log_->cache.end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  append_locked(kSet, key, desired);
  return desired;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = detail::deadline_after(timeout);
  auto pause = std::chrono::microseconds(50);
  while (true) {
    std::vector<std::string> missing;
    {
      Locked lock(*this);
      for (const auto& key : keys) {
        if (log_->cache.count(key) == 0) missing.push_back(key);
      }
    }
    if (missing.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) throw detail::store_timeout("FileStore", timeout, missing);
    // Back off from 50 us to 10 ms: quick when peers are close behind, cheap when they are not.
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  Locked lock(*this);
  return std::all_of(keys.begin(), keys.end(),
                     [&](const auto& k) { return log_->cache.count(k) > 0; });
}

bool FileStore::delete_key(const std::string& key) {
  Locked lock(*this);
  if (log_->cache.count(key) == 0) return false;
  append_locked(kDelete, key, "");
  return true;
}

int64_t FileStore::num_keys() {
  Locked lock(*this);
  return static_cast<int64_t>(log_->cache.size());
}

}  // namespace tutti
