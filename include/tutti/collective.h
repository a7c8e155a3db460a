// The Ray-style API: named groups joined by this process, and collectives over them by name.
//
//   tutti::init_collective_group(world_size, rank, "gloo", "default", options);
//   tutti::allreduce(tensor);                       // group "default", sum
//   tutti::destroy_collective_group("default");
//
// The process keeps one registry of named groups; every function here is thread-safe. An op
// on a name that is not initialised fails with Error(kInvalidUsage). Groups still initialised
// at exit are torn down before the process's static objects are destroyed.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/collective_group.h"
#include "tutti/export.h"
#include "tutti/options.h"
#include "tutti/tensor_view.h"

namespace tutti {

// Any non-empty name is valid. Without a store or store URL, a group of one needs no store and
// a larger group reads the environment (env://).
TUTTI_API void init_collective_group(int world_size, int rank, std::string_view backend = "gloo",
                                     std::string_view group_name = "default",
                                     const GroupOptions& options = {});
// An unknown name is a logged no-op. Never throws. An op of the group running in another
// thread ends at once with kAborted.
TUTTI_API void destroy_collective_group(std::string_view group_name = "default");
// Aborts a named group from any thread (see CollectiveGroup::abort): its running and queued ops
// end with kAborted naming `reason`; it stays registered, aborted, until destroyed. False when
// the group is not initialised. Never throws.
TUTTI_API bool abort_collective_group(std::string_view group_name = "default",
                                      const std::string& reason = "aborted by the application");
// Splits `ranks` of the group `parent` into a new named group (torch's new_group): collective,
// every rank of `parent` calls it with the same ranks. The members get the new group, also
// registered under `group_name` (empty: "<parent>.split<n>"); the others get null. `backend`
// empty: the parent's.
TUTTI_API std::shared_ptr<CollectiveGroup> new_group(const std::vector<int>& ranks,
                                                     std::string_view backend = "",
                                                     std::string_view group_name = "",
                                                     std::string_view parent = "default");
TUTTI_API bool is_group_initialized(std::string_view group_name = "default");
// -1 where the group is not initialised in this process.
TUTTI_API int get_rank(std::string_view group_name = "default");
TUTTI_API int get_collective_group_size(std::string_view group_name = "default");
// A handle that stays valid after destroy (its calls then fail with kInvalidUsage); throws
// Error(kInvalidUsage) when the group is not initialised.
TUTTI_API std::shared_ptr<CollectiveGroup> get_group(std::string_view group_name = "default");

TUTTI_API void allreduce(TensorView tensor, std::string_view group_name = "default",
                         ReduceOp op = ReduceOp::kSum);
TUTTI_API void barrier(std::string_view group_name = "default");
TUTTI_API void reduce(TensorView tensor, int dst_rank = 0, std::string_view group_name = "default",
                      ReduceOp op = ReduceOp::kSum);
TUTTI_API void broadcast(TensorView tensor, int src_rank = 0,
                         std::string_view group_name = "default");
TUTTI_API void allgather(const std::vector<TensorView>& output_list, TensorView input,
                         std::string_view group_name = "default");
TUTTI_API void allgather(TensorView output, TensorView input,
                         std::string_view group_name = "default");
TUTTI_API void reduce_scatter(TensorView output, const std::vector<TensorView>& input_list,
                              std::string_view group_name = "default",
                              ReduceOp op = ReduceOp::kSum);
TUTTI_API void reduce_scatter(TensorView output, TensorView input,
                              std::string_view group_name = "default",
                              ReduceOp op = ReduceOp::kSum);
TUTTI_API void send(TensorView tensor, int dst_rank, std::string_view group_name = "default");
TUTTI_API void recv(TensorView tensor, int src_rank, std::string_view group_name = "default");
// Several sends and receives posted together (see CollectiveGroup::batch_isend_irecv).
TUTTI_API void batch_isend_irecv(const std::vector<P2POp>& ops,
                                 std::string_view group_name = "default");
TUTTI_API void alltoall(const std::vector<TensorView>& output_list,
                        const std::vector<TensorView>& input_list,
                        std::string_view group_name = "default");
TUTTI_API void alltoall(TensorView output, TensorView input,
                        std::string_view group_name = "default");
TUTTI_API void alltoallv(TensorView output, TensorView input,
                         const std::vector<int64_t>& output_counts,
                         const std::vector<int64_t>& input_counts,
                         std::string_view group_name = "default");
TUTTI_API void allgatherv(TensorView output, TensorView input, const std::vector<int64_t>& counts,
                          std::string_view group_name = "default");
TUTTI_API void gather(const std::vector<TensorView>& output_list, TensorView input,
                      int dst_rank = 0, std::string_view group_name = "default");
TUTTI_API void gather(TensorView output, TensorView input, int dst_rank = 0,
                      std::string_view group_name = "default");
TUTTI_API void scatter(TensorView output, const std::vector<TensorView>& input_list,
                       int src_rank = 0, std::string_view group_name = "default");
TUTTI_API void scatter(TensorView output, TensorView input, int src_rank = 0,
                       std::string_view group_name = "default");

// Multi-device forms, Ray's *_multigpu: one process driving several GPUs (see
// CollectiveGroup::allreduce_multigpu for the list rules).
TUTTI_API void allreduce_multigpu(const std::vector<TensorView>& tensor_list,
                                  std::string_view group_name = "default",
                                  ReduceOp op = ReduceOp::kSum);
TUTTI_API void reduce_multigpu(const std::vector<TensorView>& tensor_list, int dst_rank = 0,
                               int dst_tensor = 0, std::string_view group_name = "default",
                               ReduceOp op = ReduceOp::kSum);
TUTTI_API void broadcast_multigpu(const std::vector<TensorView>& tensor_list, int src_rank = 0,
                                  int src_tensor = 0, std::string_view group_name = "default");
TUTTI_API void allgather_multigpu(const std::vector<std::vector<TensorView>>& output_tensor_lists,
                                  const std::vector<TensorView>& input_tensor_list,
                                  std::string_view group_name = "default");
TUTTI_API void reduce_scatter_multigpu(
    const std::vector<TensorView>& output_tensor_list,
    const std::vector<std::vector<TensorView>>& input_tensor_lists,
    std::string_view group_name = "default", ReduceOp op = ReduceOp::kSum);
TUTTI_API void send_multigpu(TensorView tensor, int dst_rank, int dst_gpu_index,
                             std::string_view group_name = "default", int64_t n_elements = 0);
TUTTI_API void recv_multigpu(TensorView tensor, int src_rank, int src_gpu_index,
                             std::string_view group_name = "default", int64_t n_elements = 0);
// Waits on the host for everything the group enqueued on `device` (Ray's synchronize).
TUTTI_API void synchronize(Device device, std::string_view group_name = "default");

}  // namespace tutti
