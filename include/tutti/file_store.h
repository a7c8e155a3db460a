// FileStore: a Store kept in one file, for processes on one host or on a shared file system.
//
// The file is an append-only log of records guarded by flock(2); every process replays what
// others appended. Thread-safe within a process, and safe across processes. Waits poll the file
// with a short back-off until their deadline. The file is never deleted by the store: use a
// fresh path per job (or let the launcher pick one). It is created readable and writable by its
// owner only (0600), and never opened through a symbolic link. FileStores of one file in one
// process share what they replayed: opening the file again reads only what is new.
#pragma once

#include <memory>

#include "tutti/store.h"

namespace tutti {

namespace detail {
struct FileStoreLog;  // what has been replayed of one file, shared within the process
}  // namespace detail

class TUTTI_API FileStore : public Store {
 public:
  // Throws Error(kIoError) naming the path when the file cannot be opened or created, and
  // kInvalidArgument when the path is a symbolic link or not a regular file.
  explicit FileStore(std::string path, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& path() const { return path_; }

 private:
  class Locked;  // holds the flock and the process-local mutex for one operation
  void refresh_locked();
  void append_locked(char kind, const std::string& key, const std::string& value);

  std::string path_;
  int fd_ = -1;
  std::shared_ptr<detail::FileStoreLog> log_;
};

}  // namespace tutti
