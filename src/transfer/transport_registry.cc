// The registry of tensor transports (TransportInfo, "auto"), the built-in socket transport,
// TensorTransport's and TransportPeer's defaults, and an agent's transports made from the
// registry (tutti/tensor_transport.h).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>

#include "transfer/agent_core.h"
#include "tutti/plugin_loader.h"
#include "tutti/tensor_transport.h"

namespace tutti {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, TransportInfo>& registry() {
  static std::map<std::string, TransportInfo> r;
  return r;
}

bool is_available(const TransportInfo& info) {
  return !info.available || info.available();
}

// "socket": the owner's agent writes the bytes to the consumer's connection (any host). No
// lease: the owner holds the object while it streams.
class SocketTransport final : public TensorTransport {
 public:
  const char* name() const override { return "socket"; }
  TransportTraits traits() const override {
    TransportTraits t;
    t.one_sided = false;
    t.cross_host = true;
    t.holds_itself = true;  // the owner's stream handler holds it and counts the get
    return t;
  }
  Publication publish(const PublishRequest&) override { return {}; }
  FetchResult fetch(const FetchRequest& request) override {
    request.owner.stream(request.targets);
    return {};
  }
};

// Only "socket" is the core's; the others register themselves with their libraries (shm,
// cuda_ipc, and the two-sided gloo and nccl with their collective backends).
void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    TransportInfo socket;
    socket.name = "socket";
    socket.factory = [](const TransportContext&) { return std::make_unique<SocketTransport>(); };
    socket.priority = 10;
    registry()["socket"] = std::move(socket);
  });
}

}  // namespace

// ---- TensorTransport and TransportPeer defaults ----

TransportPeer::~TransportPeer() = default;
std::string TransportPeer::call_with(const std::function<std::string()>& make,
                                     std::vector<int>* fds, bool* replied) {
  // The base class cannot tell the owner's errors from the connection's: `replied` stays unset
  // on any error.
  std::string answer = call(make(), fds);
  if (replied != nullptr) *replied = true;
  return answer;
}
TransportOwner::~TransportOwner() = default;
TensorTransport::~TensorTransport() = default;
void TensorTransport::unpublish(ObjectId) noexcept {}
std::string TensorTransport::answer(const std::string&, const AgentIdentity&, std::vector<int>*) {
  throw Error(ErrorCode::kUnavailable,
              std::string("transport '") + name() + "' answers no calls from consumers");
}
Reach TensorTransport::reach(const TensorRef& ref, const AgentIdentity& me) const {
  if (traits().cross_host || ref.owner().same_host(me)) return {};
  const AgentIdentity& o = ref.owner();
  Reach r;
  r.direct = false;
  r.why = std::string("transport '") + name() + "' works on one host, and agent '" + o.name +
          "' (pid " + std::to_string(o.pid) + ") is on another host, network or pid namespace" +
          (traits().cuda            ? " (CUDA tensors have no fallback: send them over a two-sided "
                                      "transport such as 'nccl')"
           : o.tcp_endpoint.empty() ? " (and does not listen on TCP for the socket transport)"
                                    : " (GetOptions::allow_fallback takes another transport)");
  return r;
}
void TensorTransport::stop() noexcept {}
std::string TensorTransport::answer_with(const AnswerRequest& request) {
  return answer(request.request, request.consumer, request.fds);
}
TensorView TensorTransport::allocate(size_t, DType) {
  throw Error(ErrorCode::kUnavailable,
              std::string("transport '") + name() + "' has no shareable memory to allocate");
}
void TensorTransport::deallocate(const TensorView& memory) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("transport '") + name() + "' did not allocate " + memory.str());
}
bool TensorTransport::owns(const TensorView&) const {
  return false;
}
void TensorTransport::register_memory(const TensorView& region, int, uint64_t) {
  throw Error(ErrorCode::kUnavailable, std::string("transport '") + name() +
                                           "' cannot register memory (" + region.str() + ")");
}
void TensorTransport::unregister_memory(const TensorView& region) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("transport '") + name() + "' did not register " + region.str());
}

// ---- the registry ----

void register_tensor_transport(TransportInfo info) {
  register_builtins();
  if (info.name.empty() || !info.factory || info.devices.empty()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "register_tensor_transport: " +
            (info.name.empty() ? std::string("an empty name")
                               : std::string(info.factory ? "no devices" : "a null factory") +
                                     " for '" + info.name + "'"));
  }
  const std::string key = detail::transport_key(info.name);
  if (key == "auto") {
    throw Error(ErrorCode::kInvalidUsage,
                "register_tensor_transport: 'auto' is reserved (PutOptions::transport's choice)");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  const std::string name = info.name;
  auto [it, inserted] = registry().emplace(key, std::move(info));
  if (!inserted) {
    throw Error(ErrorCode::kInvalidUsage,
                "register_tensor_transport: '" + name + "' is already registered");
  }
}

void register_tensor_transport(std::string_view name, TensorTransportFactory factory,
                               std::function<bool()> available) {
  TransportInfo info;
  info.name = std::string(name);
  info.factory = std::move(factory);
  info.available = std::move(available);
  register_tensor_transport(std::move(info));
}

bool is_registered_tensor_transport(std::string_view name) {
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(detail::transport_key(name));
  return it != registry().end() && is_available(it->second);
}

std::vector<std::string> registered_tensor_transports() {
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& [name, info] : registry()) {
    if (is_available(info)) out.push_back(name);
  }
  return out;
}

namespace detail {

bool transport_name_taken(std::string_view name) {
  register_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().count(transport_key(name)) != 0;
}

std::string transport_key(std::string_view name) {
  std::string out(name);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

namespace {

// Under the registry's lock: the available transport of highest priority that carries `device`'s
// tensors and that `eligible` takes, or null.
const TransportInfo* best_locked(DeviceType device,
                                 const std::function<bool(const TransportInfo&)>& eligible) {
  const TransportInfo* best = nullptr;
  for (const auto& [name, info] : registry()) {
    const bool carries =
        std::find(info.devices.begin(), info.devices.end(), device) != info.devices.end();
    if (carries && eligible(info) && (!best || info.priority > best->priority) &&
        is_available(info)) {
      best = &info;
    }
  }
  return best;
}

}  // namespace

std::string auto_transport(DeviceType device) {
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::lock_guard<std::mutex> lock(registry_mutex());
  const TransportInfo* best =
      best_locked(device, [](const TransportInfo& info) { return info.priority >= 0; });
  if (best == nullptr) {
    throw Error(ErrorCode::kUnavailable,
                std::string("transport 'auto': no available transport carries ") +
                    (device == DeviceType::kCUDA
                         ? "CUDA tensors here (link tutti::cuda_ipc, where a GPU is visible, or "
                           "put on 'nccl' after join_group)"
                         : "CPU tensors here"));
  }
  return detail::transport_key(best->name);
}

std::string across_hosts_setting() {
  const char* env = std::getenv("TUTTI_TRANSFER_ACROSS_HOSTS");
  return transport_key(env != nullptr && *env != '\0' ? env : "auto");
}

std::string across_hosts_transport(DeviceType device, bool tls) {
  const std::string wanted = across_hosts_setting();
  if (wanted == "socket" || (tls && wanted == "auto")) return "";
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::lock_guard<std::mutex> lock(registry_mutex());
  const TransportInfo* best = best_locked(device, [&](const TransportInfo& info) {
    return info.across_hosts && (wanted == "auto" || wanted == transport_key(info.name));
  });
  if (best == nullptr && wanted != "auto") {
    throw Error(
        ErrorCode::kInvalidArgument,
        "TUTTI_TRANSFER_ACROSS_HOSTS=" + std::string(std::getenv("TUTTI_TRANSFER_ACROSS_HOSTS")) +
            ": no available transport of that name reaches other hosts one-sidedly "
            "(give 'auto', 'socket' or a loaded one such as 'ucx')");
  }
  return best ? transport_key(best->name) : "";
}

bool is_across_hosts_transport(const std::string& name) {
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(transport_key(name));
  if (it == registry().end()) return false;
  const auto& devices = it->second.devices;
  return it->second.across_hosts &&
         std::find(devices.begin(), devices.end(), DeviceType::kCPU) != devices.end() &&
         is_available(it->second);
}

}  // namespace detail

namespace detail {

TensorTransport& AgentCore::transport(const std::string& requested) {
  register_builtins();
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  const std::string name = detail::transport_key(requested);
  std::lock_guard<std::mutex> lock(transports_mutex);
  auto it = transports.find(name);
  if (it != transports.end()) return *it->second;
  TensorTransportFactory factory;
  {
    std::lock_guard<std::mutex> registry_lock(registry_mutex());
    auto r = registry().find(name);
    if (r == registry().end() || !is_available(r->second)) {
      std::string known;
      for (const auto& [n, info] : registry()) {
        if (is_available(info)) known += (known.empty() ? "" : ", ") + n;
      }
      throw Error(ErrorCode::kUnavailable,
                  who() + ": no tensor transport '" + requested + "' in this process (" +
                      (r == registry().end() ? "registered: " : "not available here; available: ") +
                      known + ")");
    }
    factory = r->second.factory;
  }
  auto t = factory(TransportContext{identity});
  if (!t) {
    throw Error(ErrorCode::kInternal,
                who() + ": the factory of transport '" + name + "' made nothing");
  }
  return *transports.emplace(name, std::move(t)).first->second;
}

}  // namespace detail
}  // namespace tutti
