// "hier": collectives in two levels, for ranks that share hosts across several hosts (internal to
// the Gloo library, which registers it).
//
// Each host's ranks form a local level (the shm backend, or Gloo where shm is not built), and the
// lowest rank of each host joins the leaders' level (Gloo). An allreduce reduces into the host's
// leader through shared memory, allreduces between the leaders over the network, and broadcasts
// back through shared memory: only one rank per host sends, and what stays on a host never touches
// a socket. Broadcast and barrier go the same way; every other op (reduce, the gathers and
// scatters, alltoall, point-to-point) runs on a flat Gloo level of every rank.
//
// "auto" picks it when the ranks are on several hosts and at least one host has several of them
// (docs/PERFORMANCE.md has the measurements). A level's failure aborts the group like a failure
// of any backend; abort() aborts every level.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tutti/backend.h"

namespace tutti::gloo_backend {

class HierBackend final : public Backend {
 public:
  explicit HierBackend(const BackendContext& ctx);
  ~HierBackend() override;

  // Several hosts, and several ranks on at least one: where "auto" takes this backend.
  static bool suits(const std::vector<std::string>& hosts);

  const char* name() const override { return "hier"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }

  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override;

  // The flat level's.
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override;
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allgather_into(const TensorView& output, const TensorView& input,
                         const AllgatherOptions& opts, const OpContext& ctx) override;
  WorkPtr allgatherv(const TensorView& output, const TensorView& input,
                     const std::vector<int64_t>& counts, const AllgathervOptions& opts,
                     const OpContext& ctx) override;
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr reduce_scatter_from(const TensorView& output, const TensorView& input,
                              const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr alltoall(const std::vector<TensorView>& outputs, const std::vector<TensorView>& inputs,
                   const AlltoallOptions& opts, const OpContext& ctx) override;
  WorkPtr alltoall_base(const TensorView& output, const TensorView& input,
                        const std::vector<int64_t>& output_counts,
                        const std::vector<int64_t>& input_counts, const AlltoallOptions& opts,
                        const OpContext& ctx) override;
  WorkPtr gather(const std::vector<TensorView>& outputs, const TensorView& input,
                 const GatherOptions& opts, const OpContext& ctx) override;
  WorkPtr scatter(const TensorView& output, const std::vector<TensorView>& inputs,
                  const ScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
               const OpContext& ctx) override;
  WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
               const OpContext& ctx) override;
  WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                    const OpContext& ctx) override;

  void abort(const std::string& reason) override;
  // The host level's symmetric memory (its local ops' single-copy paths); on a host of one
  // rank, its own memory.
  std::unique_ptr<SymmetricRegion> create_symmetric(size_t bytes) override;

 private:
  // One level: its backend and how this rank numbers its ops there.
  struct Level {
    std::unique_ptr<Backend> backend;
    std::shared_ptr<const std::string> name;
    int rank = 0;
    int world = 1;
    uint64_t seq = 0;  // the level's collectives, in the same order on each of its ranks
    // For messages, whose ranks are the level's: "in 'g/host1', ranks 0, 1 are ranks 2, 3 of
    // group 'g'".
    std::string legend;
  };

  // Runs one collective of `level` for the parent op `parent`, within what is left until the
  // parent op's `deadline` (taken once, when it started); its failure names the parent op, then
  // the level's.
  template <typename Issue>
  void run(Level& level, OpType op, const OpSignature& signature, const OpContext& parent,
           std::chrono::steady_clock::time_point deadline, Issue&& issue);

  std::vector<int> local_ranks_;  // this host's ranks, in the local level's order
  int host_ = 0;                  // this rank's host, numbered by first appearance in rank order
  std::vector<int> host_of_;      // by rank
  std::vector<int> local_index_;  // by rank: its index among its host's ranks
  int world_ = 1;
  Level local_;    // this host's ranks; no backend when alone on its host
  Level leaders_;  // one rank per host; no backend off the leaders, or on one host
  std::unique_ptr<Backend> flat_;
};

}  // namespace tutti::gloo_backend
