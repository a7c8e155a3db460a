#include "tutti/backend.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "tutti/error.h"

namespace tutti {

const char* to_string(OpType op) noexcept {
  switch (op) {
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllreduce: return "allreduce";
    case OpType::kReduce: return "reduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
  }
  return "unknown";
}

std::string OpContext::description() const {
  return std::string(to_string(op)) + " #" + std::to_string(seq) + " on group '" +
         (group_name ? *group_name : std::string("?")) + "' (rank " + std::to_string(rank) + "/" +
         std::to_string(world_size) + ")";
}

Backend::~Backend() = default;

bool Backend::supports(OpType) const { return true; }

void Backend::synchronize(Device) {}

namespace {
[[noreturn]] void unsupported(const Backend& backend, OpType op, const OpContext& ctx) {
  throw Error(ErrorCode::kUnavailable, ctx.description() + ": backend '" + backend.name() +
                                           "' does not support '" + to_string(op) + "'");
}
}  // namespace

void Backend::broadcast(const std::vector<TensorView>&, const BroadcastOptions&,
                        const OpContext& ctx) {
  unsupported(*this, OpType::kBroadcast, ctx);
}
void Backend::allreduce(const std::vector<TensorView>&, const AllreduceOptions&,
                        const OpContext& ctx) {
  unsupported(*this, OpType::kAllreduce, ctx);
}
void Backend::reduce(const std::vector<TensorView>&, const ReduceOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kReduce, ctx);
}
void Backend::allgather(const std::vector<std::vector<TensorView>>&,
                        const std::vector<TensorView>&, const AllgatherOptions&,
                        const OpContext& ctx) {
  unsupported(*this, OpType::kAllgather, ctx);
}
void Backend::reduce_scatter(const std::vector<TensorView>&,
                             const std::vector<std::vector<TensorView>>&,
                             const ReduceScatterOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kReduceScatter, ctx);
}
void Backend::barrier(const BarrierOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kBarrier, ctx);
}
void Backend::send(const std::vector<TensorView>&, int, const SendOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kSend, ctx);
}
void Backend::recv(const std::vector<TensorView>&, int, const RecvOptions&, const OpContext& ctx) {
  unsupported(*this, OpType::kRecv, ctx);
}

namespace detail {

struct RegisteredBackend {
  BackendFactory factory;
  std::function<bool()> available;
};

struct BackendRegistry {
  std::mutex mutex;
  std::map<std::string, RegisteredBackend> entries;
};

BackendRegistry& registry() {
  // Leaked: backends register from static initialisers of other libraries, and groups torn
  // down at exit may still look backends up.
  static auto* instance = new BackendRegistry();
  return *instance;
}

std::string backend_key(std::string_view name) {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return key;
}

// Used by CollectiveGroup::create; throws kUnavailable naming the registered backends.
BackendFactory find_backend_factory(std::string_view name) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.entries.find(backend_key(name));
  if (it != reg.entries.end()) return it->second.factory;
  std::string known;
  for (const auto& [key, entry] : reg.entries) known += (known.empty() ? "" : ", ") + key;
  throw Error(ErrorCode::kUnavailable,
              "backend '" + std::string(name) + "' is not registered (registered: " +
                  (known.empty() ? std::string("none; link tutti::gloo") : known) + ")");
}

}  // namespace detail

void register_collective_backend(std::string_view name, BackendFactory factory,
                                 std::function<bool()> available) {
  if (detail::backend_key(name) == "auto") {
    throw Error(ErrorCode::kInvalidUsage,
                "register_collective_backend: 'auto' is reserved (it picks shm or gloo)");
  }
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "register_collective_backend: empty backend name");
  }
  if (!factory) {
    throw Error(ErrorCode::kInvalidArgument,
                "register_collective_backend('" + std::string(name) + "'): null factory");
  }
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const std::string key = detail::backend_key(name);
  if (reg.entries.count(key) != 0) {
    throw Error(ErrorCode::kInvalidUsage,
                "register_collective_backend: backend '" + key + "' is already registered");
  }
  reg.entries.emplace(key, detail::RegisteredBackend{std::move(factory), std::move(available)});
}

bool is_registered_collective_backend(std::string_view name) {
  if (detail::backend_key(name) == "auto") return true;  // resolved by each group
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.entries.count(detail::backend_key(name)) != 0;
}

bool is_backend_available(std::string_view name) {
  if (detail::backend_key(name) == "auto") {
    return is_backend_available("shm") || is_backend_available("gloo");
  }
  std::function<bool()> available;
  {
    auto& reg = detail::registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.entries.find(detail::backend_key(name));
    if (it == reg.entries.end()) return false;
    available = it->second.available;
  }
  return !available || available();
}

std::vector<std::string> registered_collective_backends() {
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> names;
  for (const auto& [key, entry] : reg.entries) names.push_back(key);
  return names;
}

}  // namespace tutti
