// tutti as a torch.distributed backend ("tutti"): a c10d::Backend whose ops run on a tutti
// CollectiveGroup (tutti._torch; `import tutti.torch` registers it).
//
// One tutti group per process group, met through the process group's own store (no second
// server); its backend is TUTTI_BACKEND (default "auto": shm on one host, hier or gloo across
// hosts). CUDA tensors go to a second group on tutti's NCCL backend, made on the first CUDA op
// and ordered on the caller's current stream.
//
// Tensors travel in place (their data pointers; no DLPack round trip). A non-contiguous tensor
// is copied into a contiguous one and its result copied back when the op is done, as torch's
// gloo backend does. Ops that only move bytes take every dtype (as bytes); reductions take the
// dtypes tutti reduces, complex ones as (real, imaginary) pairs for sums and averages.
//
// Async: an op torch issues with async_op=True (DDP's buckets, isend/irecv) larger than
// TUTTI_TORCH_INLINE_BYTES (default 64 KiB) runs on the group's worker thread and its Work
// completes later; others run on the calling thread, and their Work is complete on return.
// Point-to-point ops are posted together as one batch (batch_isend_irecv) at the next wait, the
// next collective, or the end of a coalescing block, so isend/irecv in any order cannot
// deadlock.
//
// Threads: torch may issue from any thread; ops are issued one at a time, in issue order, and
// the group is handed to the issuing thread when it changes.
// Errors: c10::DistBackendError (torch.distributed.DistBackendError) carrying tutti's message,
// which names the group, the rank, the op and the offending value.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "torch_tensors.h"
#include "torch_work.h"
#include "tutti/collective_group.h"

namespace tutti::torch_backend {

class TuttiBackend final : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout)
        : c10d::Backend::Options("tutti", timeout) {}
    // Overrides c10d::Backend::Options::clone where torch has it (not 2.11): no `override`, so
    // that the module builds against either.
    c10::intrusive_ptr<c10d::Backend::Options> clone() const {  // NOLINT(modernize-use-override)
      return c10::make_intrusive<Options>(*this);
    }
    std::string tutti_backend = "auto";  // tutti's backend for CPU tensors
  };

  // Meets the other ranks through `store` (collective); kTimeout names the missing ranks.
  TuttiBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
               c10::intrusive_ptr<Options> options);
  ~TuttiBackend() override;

  const std::string getBackendName() const override { return "tutti"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  uint64_t getSequenceNumberForGroup() override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  void abort() override;
  void shutdown() override;

  // The tutti group behind CPU tensors (for tests and tutti's own calls).
  std::shared_ptr<CollectiveGroup> group() const;

  // Collective (every rank, the same sizes and dtype, in op order): a zeroed CPU tensor in the
  // CPU group's symmetric memory (CollectiveGroup::allocate_symmetric), which shm's collectives
  // reduce and copy without staging; the memory goes with the tensor's storage.
  at::Tensor empty_symmetric(const std::vector<int64_t>& sizes, at::ScalarType dtype);

  // Issues the ops (internal, shared with the Works of pending point-to-point ops, which post
  // them when waited on).
  struct Issuer;
  // Internal: a backend over a group made already (split).
  TuttiBackend(std::shared_ptr<Issuer> issuer, c10::intrusive_ptr<Options> options);

 private:
  // Runs one op: flushes pending point-to-point ops, takes the group for `device`, issues
  // `issue(group, async)` and wraps its Work (finish: what runs once it is done, before the copy
  // backs of `staged`, whose originals are the result).
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, const at::Device& device, bool async,
                                     size_t bytes, std::vector<Staged> staged,
                                     std::vector<at::Tensor> outputs, std::function<void()> finish,
                                     Issue&& issue);
  c10::intrusive_ptr<c10d::Work> result(c10::intrusive_ptr<TuttiWork> work);
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, bool send);

  std::shared_ptr<Issuer> issuer_;
  c10::intrusive_ptr<Options> options_;
};

}  // namespace tutti::torch_backend
