// The shm backend: CPU tensors of ranks on one host, through one shared-memory segment per
// group (internal).
//
// The segment holds a barrier, per-rank control words, two small-message slots per rank (a
// sequence number, a tag and up to 16 KiB, 48 bytes of it in the same cache line), two staging
// halves per rank for large messages (alternated from chunk to chunk, so no chunk waits for the
// readers of the one before) and a two-slot mailbox per (sender, receiver) pair. It is created by rank 0 with a name carrying the job's
// and group's identity, sized once, and unlinked as soon as every rank has attached, so neither
// destroy nor a crash leaves it in /dev/shm.
//
// Large allreduce/reduce/reduce_scatter split the reduction across ranks (each reduces its
// slice of a chunk from every rank's staging area), with vectorised kernels; small messages
// (up to 16 KiB) are published in each rank's slot and read by every peer once its sequence
// number shows: one cache line per peer for a tiny message, no shared counter. Waits spin briefly while every rank has a core, then sleep on a futex until the
// op's deadline; a rank that never arrives is named in the kTimeout error. Each collective
// checks, after its first barrier, that every rank called the same op (same tag), and fails
// with kRemoteError naming the rank otherwise.
//
// Threads: the group calls one op at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shm_wait.h"
#include "tutti/backend.h"

namespace tutti::shm_backend {

struct Header;
struct RankSlot;
struct Channel;
struct SmallSlot;

class ShmBackend : public Backend {
 public:
  explicit ShmBackend(const BackendContext& ctx);
  ~ShmBackend() override;

  const char* name() const override { return "shm"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }

  void broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                 const OpContext& ctx) override;
  void allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                 const OpContext& ctx) override;
  void reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
              const OpContext& ctx) override;
  void allgather(const std::vector<std::vector<TensorView>>& outputs,
                 const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                 const OpContext& ctx) override;
  void reduce_scatter(const std::vector<TensorView>& outputs,
                      const std::vector<std::vector<TensorView>>& inputs,
                      const ReduceScatterOptions& opts, const OpContext& ctx) override;
  void barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  void send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
            const OpContext& ctx) override;
  void recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
            const OpContext& ctx) override;

 private:
  struct Op;  // one collective in flight: deadline, tag check
  void sync(Op& op);
  void exchange(Op& op, const void* payload, size_t bytes);
  [[noreturn]] void mismatch(const Op& op, int rank, uint32_t theirs) const;
  SmallSlot& small_slot(int rank, uint32_t parity) const;
  char* small_payload(int rank, uint32_t parity, size_t bytes) const;
  char* stage(int rank, int half) const;
  char* mailbox(int src, int dst, int slot) const;
  Channel& channel(int src, int dst) const;
  void reduce_chunks(const TensorView& t, ReduceOp reduce_op, int root, Op& op);

  int rank_;
  int world_size_;
  size_t chunk_ = 0;    // bytes per staging half
  size_t mail_ = 0;     // bytes per mailbox slot
  SpinPolicy spin_;
  void* base_ = nullptr;
  size_t size_ = 0;
  Header* header_ = nullptr;
  RankSlot* slots_ = nullptr;
  Channel* channels_ = nullptr;
  char* small_ = nullptr;
  char* staging_ = nullptr;
  char* mailboxes_ = nullptr;
  uint32_t epoch_ = 0;   // barriers this rank has entered
  uint64_t flips_ = 0;   // staging halves used so far (the same count on every rank)
  uint64_t ops_ = 0;     // collectives so far
  std::vector<const void*> inputs_;  // one pointer per rank, for reductions (sized once)
};

}  // namespace tutti::shm_backend
