// The process-wide registry of named groups behind the Ray-style free functions.
#include "tutti/collective.h"

#include <pthread.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "group/group_state.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti {
namespace {

struct GroupRegistry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<CollectiveGroup>, std::less<>> groups;
  std::set<std::string, std::less<>> initializing;  // names whose rendezvous is under way
  bool exit_hook_installed = false;
};

GroupRegistry& registry() {
  // Leaked: the exit hook below empties it before static destructors run.
  static auto* instance = [] {
    auto* reg = new GroupRegistry();
    // Held across fork(), so that a child never inherits it locked by a thread it lacks (its
    // exit hook takes it).
    ::pthread_atfork([] { registry().mutex.lock(); }, [] { registry().mutex.unlock(); },
                     [] { registry().mutex.unlock(); });
    return reg;
  }();
  return *instance;
}

// Runs at exit, before the static objects of tutti and of the libraries it loaded were
// destroyed (the hook is installed after they were constructed): background threads of every
// group still initialised stop here.
void destroy_all_groups_at_exit() {
  std::map<std::string, std::shared_ptr<CollectiveGroup>, std::less<>> groups;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    groups.swap(registry().groups);
  }
  for (auto& [name, group] : groups) group->destroy();
  detail::wait_for_lingering_stores();  // the hosts among them serve the slower ranks a while
}

std::shared_ptr<CollectiveGroup> find(std::string_view name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.groups.find(name);
  return it == reg.groups.end() ? nullptr : it->second;
}

std::shared_ptr<CollectiveGroup> require(std::string_view name, const char* op) {
  auto group = find(name);
  if (!group) {
    throw Error(ErrorCode::kInvalidUsage, std::string(op) + " on group '" + std::string(name) +
                                              "': the group is not initialized in this process "
                                              "(call init_collective_group first)");
  }
  return group;
}

}  // namespace

void init_collective_group(int world_size, int rank, std::string_view backend,
                           std::string_view group_name, const GroupOptions& options) {
  auto& reg = registry();
  const std::string name(group_name);
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (reg.groups.count(name) != 0 || reg.initializing.count(name) != 0) {
      throw Error(ErrorCode::kInvalidUsage,
                  "init on group '" + name + "' (rank " + std::to_string(rank) + "/" +
                      std::to_string(world_size) +
                      "): the group is already initialized in this process; destroy it first");
    }
    reg.initializing.insert(name);
    if (!reg.exit_hook_installed) {
      std::atexit(destroy_all_groups_at_exit);
      reg.exit_hook_installed = true;
    }
  }
  std::shared_ptr<CollectiveGroup> group;
  try {
    group = CollectiveGroup::create(world_size, rank, backend, name, options);
  } catch (...) {
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.initializing.erase(name);
    throw;
  }
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.initializing.erase(name);
  reg.groups.emplace(name, std::move(group));
}

void destroy_collective_group(std::string_view group_name) {
  std::shared_ptr<CollectiveGroup> group;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.groups.find(group_name);
    if (it == reg.groups.end()) {
      TUTTI_LOG_WARN("destroy_collective_group: group '{}' is not initialized; nothing to do",
                     std::string(group_name));
      return;
    }
    group = std::move(it->second);
    reg.groups.erase(it);
  }
  group->destroy();
}

bool abort_collective_group(std::string_view group_name, const std::string& reason) {
  auto group = find(group_name);
  if (!group) return false;
  group->abort(reason);
  return true;
}

std::shared_ptr<CollectiveGroup> new_group(const std::vector<int>& ranks, std::string_view backend,
                                           std::string_view group_name, std::string_view parent) {
  auto& reg = registry();
  const std::string name(group_name);
  if (!name.empty()) {
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (reg.groups.count(name) != 0 || reg.initializing.count(name) != 0) {
      throw Error(ErrorCode::kInvalidUsage, "new_group '" + name +
                                                "': a group of that name is already initialized in "
                                                "this process; destroy it first");
    }
  }
  SplitOptions options;
  options.name = name;
  options.backend = std::string(backend);
  auto group = require(parent, "new_group")->split(ranks, options);
  if (!group) return nullptr;
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (!reg.groups.emplace(group->name(), group).second) {
    group->destroy();
    throw Error(ErrorCode::kInvalidUsage, "new_group '" + group->name() +
                                              "': a group of that name was initialized meanwhile");
  }
  return group;
}

bool is_group_initialized(std::string_view group_name) {
  return find(group_name) != nullptr;
}

int get_rank(std::string_view group_name) {
  auto group = find(group_name);
  return group ? group->rank() : -1;
}

int get_collective_group_size(std::string_view group_name) {
  auto group = find(group_name);
  return group ? group->world_size() : -1;
}

std::shared_ptr<CollectiveGroup> get_group(std::string_view group_name) {
  return require(group_name, "get_group");
}

void allreduce(TensorView tensor, std::string_view group_name, ReduceOp op) {
  AllreduceOptions opts;
  opts.reduce_op = op;
  require(group_name, "allreduce")->allreduce(tensor, opts);
}

void barrier(std::string_view group_name) {
  require(group_name, "barrier")->barrier();
}

void reduce(TensorView tensor, int dst_rank, std::string_view group_name, ReduceOp op) {
  ReduceOptions opts;
  opts.root_rank = dst_rank;
  opts.reduce_op = op;
  require(group_name, "reduce")->reduce(tensor, opts);
}

void broadcast(TensorView tensor, int src_rank, std::string_view group_name) {
  BroadcastOptions opts;
  opts.root_rank = src_rank;
  require(group_name, "broadcast")->broadcast(tensor, opts);
}

void allgather(const std::vector<TensorView>& output_list, TensorView input,
               std::string_view group_name) {
  require(group_name, "allgather")->allgather(output_list, input);
}

void allgather(TensorView output, TensorView input, std::string_view group_name) {
  require(group_name, "allgather")->allgather(output, input);
}

void reduce_scatter(TensorView output, const std::vector<TensorView>& input_list,
                    std::string_view group_name, ReduceOp op) {
  ReduceScatterOptions opts;
  opts.reduce_op = op;
  require(group_name, "reduce_scatter")->reduce_scatter(output, input_list, opts);
}

void reduce_scatter(TensorView output, TensorView input, std::string_view group_name, ReduceOp op) {
  ReduceScatterOptions opts;
  opts.reduce_op = op;
  require(group_name, "reduce_scatter")->reduce_scatter(output, input, opts);
}

void send(TensorView tensor, int dst_rank, std::string_view group_name) {
  require(group_name, "send")->send(tensor, dst_rank);
}

void recv(TensorView tensor, int src_rank, std::string_view group_name) {
  require(group_name, "recv")->recv(tensor, src_rank);
}

void batch_isend_irecv(const std::vector<P2POp>& ops, std::string_view group_name) {
  require(group_name, "batch_isend_irecv")->batch_isend_irecv(ops);
}

void alltoall(const std::vector<TensorView>& output_list, const std::vector<TensorView>& input_list,
              std::string_view group_name) {
  require(group_name, "alltoall")->alltoall(output_list, input_list);
}

void alltoall(TensorView output, TensorView input, std::string_view group_name) {
  require(group_name, "alltoall")->alltoall(output, input);
}

void alltoallv(TensorView output, TensorView input, const std::vector<int64_t>& output_counts,
               const std::vector<int64_t>& input_counts, std::string_view group_name) {
  require(group_name, "alltoallv")->alltoallv(output, input, output_counts, input_counts);
}

void allgatherv(TensorView output, TensorView input, const std::vector<int64_t>& counts,
                std::string_view group_name) {
  require(group_name, "allgatherv")->allgatherv(output, input, counts);
}

void gather(const std::vector<TensorView>& output_list, TensorView input, int dst_rank,
            std::string_view group_name) {
  GatherOptions opts;
  opts.root_rank = dst_rank;
  require(group_name, "gather")->gather(output_list, input, opts);
}

void gather(TensorView output, TensorView input, int dst_rank, std::string_view group_name) {
  GatherOptions opts;
  opts.root_rank = dst_rank;
  require(group_name, "gather")->gather(output, input, opts);
}

void scatter(TensorView output, const std::vector<TensorView>& input_list, int src_rank,
             std::string_view group_name) {
  ScatterOptions opts;
  opts.root_rank = src_rank;
  require(group_name, "scatter")->scatter(output, input_list, opts);
}

void scatter(TensorView output, TensorView input, int src_rank, std::string_view group_name) {
  ScatterOptions opts;
  opts.root_rank = src_rank;
  require(group_name, "scatter")->scatter(output, input, opts);
}

void allreduce_multigpu(const std::vector<TensorView>& tensor_list, std::string_view group_name,
                        ReduceOp op) {
  AllreduceOptions opts;
  opts.reduce_op = op;
  require(group_name, "allreduce")->allreduce_multigpu(tensor_list, opts);
}

void reduce_multigpu(const std::vector<TensorView>& tensor_list, int dst_rank, int dst_tensor,
                     std::string_view group_name, ReduceOp op) {
  ReduceOptions opts;
  opts.root_rank = dst_rank;
  opts.root_tensor = dst_tensor;
  opts.reduce_op = op;
  require(group_name, "reduce")->reduce_multigpu(tensor_list, opts);
}

void broadcast_multigpu(const std::vector<TensorView>& tensor_list, int src_rank, int src_tensor,
                        std::string_view group_name) {
  BroadcastOptions opts;
  opts.root_rank = src_rank;
  opts.root_tensor = src_tensor;
  require(group_name, "broadcast")->broadcast_multigpu(tensor_list, opts);
}

void allgather_multigpu(const std::vector<std::vector<TensorView>>& output_tensor_lists,
                        const std::vector<TensorView>& input_tensor_list,
                        std::string_view group_name) {
  require(group_name, "allgather")->allgather_multigpu(output_tensor_lists, input_tensor_list);
}

void reduce_scatter_multigpu(const std::vector<TensorView>& output_tensor_list,
                             const std::vector<std::vector<TensorView>>& input_tensor_lists,
                             std::string_view group_name, ReduceOp op) {
  ReduceScatterOptions opts;
  opts.reduce_op = op;
  require(group_name, "reduce_scatter")
      ->reduce_scatter_multigpu(output_tensor_list, input_tensor_lists, opts);
}

void send_multigpu(TensorView tensor, int dst_rank, int dst_gpu_index, std::string_view group_name,
                   int64_t n_elements) {
  SendOptions opts;
  opts.dst_device_index = dst_gpu_index;
  require(group_name, "send")->send_multigpu(tensor, dst_rank, n_elements, opts);
}

void recv_multigpu(TensorView tensor, int src_rank, int src_gpu_index, std::string_view group_name,
                   int64_t n_elements) {
  RecvOptions opts;
  opts.src_device_index = src_gpu_index;
  require(group_name, "recv")->recv_multigpu(tensor, src_rank, n_elements, opts);
}

void synchronize(Device device, std::string_view group_name) {
  require(group_name, "synchronize")->synchronize(device);
}

}  // namespace tutti
