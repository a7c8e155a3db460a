// The shm backend's symmetric memory (CollectiveGroup::allocate_symmetric; internal).
//
// Each rank's part is a POSIX shared-memory file of its own, its pages reserved up front (a full
// /dev/shm fails the allocation, not a later touch), named for the moment of the exchange: the
// descriptor carries the name and the size. attach() numbers the region (the same number on
// every rank: every rank attaches, in the same order, once the exchange went through) and maps
// every peer's part read-write; commit() takes every name away, and so does a region that goes
// uncommitted (each rank removes all of them). A rank that dies before the others learnt its
// name leaves its file: the next process of this user to make a region removes the files of
// processes that are gone.
// After the memory a rank's file has one more page, whose first word says whether the owner
// still has the region: peers drop their mapping of a region its owner let go when the group
// next allocates (prune). The table answers the ops: which region (and where in it) holds a
// tensor of this rank, and where rank q's part of a region is mapped here.
// Threads: the table is locked; allocation runs on the caller's thread beside the group's ops.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tutti/backend.h"

namespace tutti::shm_backend {

// Where a tensor of this rank lies in symmetric memory.
struct SymmetricPlace {
  uint64_t region = 0;  // 0: not in committed symmetric memory
  uint64_t offset = 0;
};

// A mapping of a region's file: its memory (`bytes`, whole pages), then the trailer page.
struct SymmetricMapping {
  char* base = nullptr;
  size_t bytes = 0;
  size_t mapped() const;                // bytes and the trailer page
  std::atomic<uint32_t>& live() const;  // the trailer's word: 1 while the owner has the region
};

class SymmetricTable {
 public:
  SymmetricTable(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  ~SymmetricTable();
  SymmetricTable(const SymmetricTable&) = delete;
  SymmetricTable& operator=(const SymmetricTable&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  uint64_t next_region() { return ++regions_; }

  // Whether this rank has committed regions at all (one atomic load: ops ask it first).
  bool any() const { return locals_.load(std::memory_order_acquire) > 0; }
  // The committed region of this rank that holds [p, p + bytes), if any.
  SymmetricPlace find(const void* p, size_t bytes) const;
  // Rank q's part of `region` from `offset` for `bytes`, mapped here; null when this rank has
  // no such mapping or the range does not fit it.
  char* peer(int q, uint64_t region, uint64_t offset, size_t bytes) const;

  void add_local(uint64_t region, char* base, size_t bytes);
  void remove_local(uint64_t region);
  // Takes `maps` (by rank; this rank's entry empty): unmapped by prune or when the table goes.
  void add_peers(uint64_t region, std::vector<SymmetricMapping> maps);
  // Unmaps the peers' parts whose owners let them go. Safe beside the ops: a region its owner
  // dropped is in none of its ops (the owner returned from its last op on it after every rank
  // passed that op's last barrier).
  void prune();
  size_t peer_mappings() const;  // for tests and logs

 private:
  struct Local {
    uint64_t region;
    size_t bytes;
  };
  const int rank_;
  const int world_size_;
  std::atomic<uint64_t> regions_{0};  // made so far
  std::atomic<int> locals_{0};        // entries of local_: an op looks under the lock only if any
  mutable std::mutex mutex_;
  std::map<const char*, Local> local_;  // by base
  std::map<uint64_t, std::vector<SymmetricMapping>> peers_;
};

class ShmRegion : public SymmetricRegion {
 public:
  // Makes this rank's part: kIoError, or kUnavailable naming the bytes when memory is short.
  ShmRegion(std::shared_ptr<SymmetricTable> table, size_t bytes);
  ~ShmRegion() override;

  void* data() const override { return mine_.base; }
  size_t size() const override { return bytes_; }
  std::string descriptor() const override;
  void attach(const std::vector<std::string>& descriptors) override;
  void commit(bool everyone) override;

 private:
  void unlink_names() noexcept;

  std::shared_ptr<SymmetricTable> table_;
  uint64_t region_ = 0;  // numbered at attach
  size_t bytes_;         // asked for
  SymmetricMapping mine_;
  std::string name_;
  std::vector<std::string> names_;      // every rank's, from attach, removed at commit
  std::vector<SymmetricMapping> maps_;  // peers' parts, until commit
  bool listed_ = false;
};

}  // namespace tutti::shm_backend
