// Where the stand-in NCCL's ranks meet and move bytes (tests only).
//
// The ranks of one ncclUniqueId form a clique in one POSIX shared-memory segment named after the
// id, whether they are threads of one process or separate processes. The first rank to arrive
// creates the segment; the last to attach unlinks its name, and so does any rank that gives up
// before everyone arrived, so no name is left in /dev/shm. The segment holds, per rank, a
// doorbell (a futex word others bump to wake it) and the device it runs on, and per ordered pair
// of ranks a byte channel: a single-producer, single-consumer ring.
//
// Threads: one Clique per (process, segment), shared by the communicators of this process;
// each rank's transfers are driven by one thread at a time (its stream's worker).
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tutti::standin {

// One direction of one rank's part in an exchange: `bytes` to or from `peer`.
struct Transfer {
  int peer = 0;
  bool send = true;
  char* data = nullptr;  // read from when sending, written to when receiving
  size_t bytes = 0;
  size_t moved = 0;
};

class Clique {
 public:
  static constexpr int kMaxRanks = 64;

  // Attaches to the segment `name` as `rank` of `nranks`, running on the device `bus_id`
  // (non-zero). Gives up, returning ncclInternalError, when `stop` becomes true first;
  // ncclInvalidUsage when the rank is taken or the ranks disagree on nranks; ncclSystemError
  // when the segment cannot be made. `why` says what went wrong.
  static ncclResult_t attach(const std::string& name, int nranks, int rank, uint64_t bus_id,
                             const std::atomic<bool>& stop, std::shared_ptr<Clique>* out,
                             std::string* why);
  ~Clique();

  // Waits until every rank has attached (false when `stop` comes first); then refuses, with
  // ncclInvalidUsage, two ranks on one device, as NCCL does.
  ncclResult_t wait_for_all(int rank, const std::atomic<bool>& stop, std::string* why);

  // Moves every transfer to completion, all at once, so that sends and receives between the
  // same ranks never wait on each other. Transfers over one channel move in the order given.
  // False when `stop` became true first.
  bool exchange(int rank, std::vector<Transfer>& transfers, const std::atomic<bool>& stop);

  // Wakes whatever `rank` waits for (used by abort).
  void ring(int rank);

  // Unlinks the name unless every rank has attached (the last one did so already).
  void give_up();

  int nranks() const { return nranks_; }

 private:
  struct Header;
  struct Channel;
  Clique() = default;
  Header* header() const;
  Channel* channel(int from, int to) const;
  char* ring_data(int from, int to) const;

  std::string name_;
  int nranks_ = 0;
  size_t capacity_ = 0;  // bytes per channel
  size_t size_ = 0;
  void* base_ = nullptr;
};

}  // namespace tutti::standin
