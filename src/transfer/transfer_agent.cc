// TransferAgent's public face, the registry of tensor transports and the built-in socket
// transport.
#include "tutti/transfer_agent.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "transfer/agent_core.h"
#include "transfer/group_transport.h"
#include "tutti/backend.h"
#include "tutti/collective_group.h"
#include "util/fork_watch.h"
#include "util/logging.h"

namespace tutti {
namespace {

std::string lower(std::string_view name) {
  std::string out(name);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct TransportEntry {
  TensorTransportFactory factory;
  std::function<bool()> available;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, TransportEntry>& registry() {
  static std::map<std::string, TransportEntry> r;
  return r;
}

// "socket": the owner's agent writes the bytes to the consumer's connection (any host). No
// lease: the owner holds the object while it streams.
class SocketTransport final : public TensorTransport {
 public:
  const char* name() const override { return "socket"; }
  TransportTraits traits() const override { return {false, false, true}; }
  Publication publish(const PublishRequest&) override { return {}; }
  FetchResult fetch(const FetchRequest& request) override {
    request.owner.stream(request.targets);
    return {};
  }
};

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    registry()["socket"] = {[](const TransportContext&) { return std::make_unique<SocketTransport>(); },
                            nullptr};
    // Two-sided, over a group of the collective backend of the same name (when it is linked).
    for (const char* backend : {"gloo", "nccl"}) {
      const std::string name = backend;
      registry()[name] = {
          [name](const TransportContext& ctx) {
            return std::make_unique<detail::GroupTransport>(name, name == "nccl", ctx.agent.name,
                                                            ctx.agent.uuid_text());
          },
          [name] { return is_backend_available(name); }};
    }
  });
}

}  // namespace

// ---- TensorTransport and TransportPeer defaults ----

TransportPeer::~TransportPeer() = default;
TensorTransport::~TensorTransport() = default;
void TensorTransport::unpublish(ObjectId) noexcept {}
std::string TensorTransport::answer(const std::string&, const AgentIdentity&, std::vector<int>*) {
  throw Error(ErrorCode::kUnavailable,
              std::string("transport '") + name() + "' answers no calls from consumers");
}
TensorView TensorTransport::allocate(size_t, DType) {
  throw Error(ErrorCode::kUnavailable,
              std::string("transport '") + name() + "' has no shareable memory to allocate");
}
void TensorTransport::deallocate(const TensorView& memory) {
  throw Error(ErrorCode::kInvalidArgument, std::string("transport '") + name() +
                                               "' did not allocate " + memory.str());
}
bool TensorTransport::owns(const TensorView&) const { return false; }
void TensorTransport::register_memory(const TensorView& region, int, uint64_t) {
  throw Error(ErrorCode::kUnavailable, std::string("transport '") + name() +
                                           "' cannot register memory (" + region.str() + ")");
}
void TensorTransport::unregister_memory(const TensorView& region) {
  throw Error(ErrorCode::kInvalidArgument, std::string("transport '") + name() +
                                               "' did not register " + region.str());
}

// ---- the registry ----

void register_tensor_transport(std::string_view name, TensorTransportFactory factory,
                               std::function<bool()> available) {
  register_builtins();
  if (name.empty() || !factory) {
    throw Error(ErrorCode::kInvalidArgument,
                "register_tensor_transport: " +
                    std::string(name.empty() ? "an empty name" : "a null factory for '" +
                                                                     std::string(name) + "'"));
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto [it, inserted] = registry().emplace(lower(name), TransportEntry{std::move(factory), std::move(available)});
  if (!inserted) {
    throw Error(ErrorCode::kInvalidUsage,
                "register_tensor_transport: '" + std::string(name) + "' is already registered");
  }
}

bool is_registered_tensor_transport(std::string_view name) {
  register_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(lower(name));
  return it != registry().end() && (!it->second.available || it->second.available());
}

std::vector<std::string> registered_tensor_transports() {
  register_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& [name, entry] : registry()) {
    if (!entry.available || entry.available()) out.push_back(name);
  }
  return out;
}

namespace detail {

TensorTransport& AgentCore::transport(const std::string& requested) {
  register_builtins();
  const std::string name = lower(requested);
  std::lock_guard<std::mutex> lock(transports_mutex);
  auto it = transports.find(name);
  if (it != transports.end()) return *it->second;
  TransportEntry entry;
  {
    std::lock_guard<std::mutex> registry_lock(registry_mutex());
    auto r = registry().find(name);
    if (r == registry().end() || (r->second.available && !r->second.available())) {
      std::string known;
      for (const auto& [n, e] : registry()) {
        if (!e.available || e.available()) known += (known.empty() ? "" : ", ") + n;
      }
      throw Error(ErrorCode::kUnavailable,
                  who() + ": no tensor transport '" + requested + "' in this process (" +
                      (r == registry().end() ? "registered: " : "not available here; available: ") +
                      known + ")");
    }
    entry = r->second;
  }
  auto t = entry.factory(TransportContext{identity});
  if (!t) {
    throw Error(ErrorCode::kInternal, who() + ": the factory of transport '" + name + "' made nothing");
  }
  return *transports.emplace(name, std::move(t)).first->second;
}

}  // namespace detail

// ---- ObjectHandle, Borrowed, Fetch ----

const TensorRef& ObjectHandle::ref() const {
  if (!pin_) throw Error(ErrorCode::kInvalidUsage, "ObjectHandle::ref on an empty or released handle");
  return pin_->ref;
}

void ObjectHandle::release() { pin_.reset(); }

Borrowed::Borrowed() = default;
Borrowed::Borrowed(Borrowed&& other) noexcept = default;
Borrowed& Borrowed::operator=(Borrowed&& other) noexcept {
  if (this != &other) {
    release();
    views_ = std::move(other.views_);
    lease_ = std::move(other.lease_);
  }
  return *this;
}
Borrowed::~Borrowed() { release(); }

void Borrowed::release() noexcept {
  views_.clear();
  lease_.reset();
}

bool Fetch::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}

Received Fetch::wait() {
  if (!state_) throw Error(ErrorCode::kInvalidUsage, "Fetch::wait on an empty Fetch");
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->finished; });  // the get has its own deadline
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->result;
}

void Fetch::cancel() noexcept {
  if (state_) state_->cancelled.store(true);
}

// ---- TransferAgent ----

TransferAgent::TransferAgent(std::shared_ptr<detail::AgentCore> core) : core_(std::move(core)) {}

std::shared_ptr<TransferAgent> TransferAgent::create(const TransferAgentOptions& options) {
  auto core = std::make_shared<detail::AgentCore>(options);
  core->start();
  return std::shared_ptr<TransferAgent>(new TransferAgent(std::move(core)));
}

TransferAgent::~TransferAgent() {
  if (core_->forked()) {
    // A forked child's copy of its parent's agent: its threads, locks and condition variables
    // are the parent's state at the fork; destroying them could wait forever. Left as it is.
    detail::keep_forever(std::move(core_));
    return;
  }
  core_->stop();
}

const AgentIdentity& TransferAgent::identity() const { return core_->identity; }

namespace {

std::vector<TensorMeta> metas_of(const std::vector<TensorView>& tensors) {
  std::vector<TensorMeta> out;
  out.reserve(tensors.size());
  for (const TensorView& t : tensors) out.push_back(TensorMeta{t.dtype(), t.shape(), t.device()});
  return out;
}

uint64_t handle_id(const ObjectHandle& handle, const char* op, const detail::AgentCore& core) {
  core.check_process(op);
  if (!handle) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + " on " + core.who() + ": the handle is empty or released");
  }
  if (handle.ref().owner().uuid != core.identity.uuid) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + " on " + core.who() + ": the handle is for " +
                    handle.ref().describe() + ", another agent's object");
  }
  return handle.ref().object().id;
}

}  // namespace

ObjectHandle TransferAgent::put(const std::vector<TensorView>& tensors, const PutOptions& options) {
  core_->check_process("put");
  if (tensors.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "put on " + core_->who() + ": no tensors");
  }
  return core_->publish(tensors, metas_of(tensors), options, false);
}

ObjectHandle TransferAgent::reserve(const std::vector<TensorMeta>& metas, const PutOptions& options) {
  core_->check_process("reserve");
  if (metas.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "reserve on " + core_->who() + ": no tensors");
  }
  for (size_t i = 0; i < metas.size(); ++i) {
    for (int64_t d : metas[i].shape) {
      if (d < 0) {
        throw Error(ErrorCode::kInvalidArgument, "reserve on " + core_->who() + ": tensor " +
                                                     std::to_string(i) + " has shape " +
                                                     metas[i].str());
      }
    }
  }
  return core_->publish({}, metas, options, true);
}

void TransferAgent::fulfil(const ObjectHandle& handle, const std::vector<TensorView>& tensors) {
  core_->fulfil(handle_id(handle, "fulfil", *core_), tensors);
}

void TransferAgent::fail(const ObjectHandle& handle, std::string_view message) {
  core_->fail(handle_id(handle, "fail", *core_), message);
}

Received TransferAgent::get(const TensorRef& ref, const GetOptions& options) {
  core_->check_process("get");
  return core_->get(ref, options);
}

Borrowed TransferAgent::borrow(const TensorRef& ref, const GetOptions& options) {
  core_->check_process("borrow");
  return core_->borrow(ref, options);
}

Fetch TransferAgent::get_async(const TensorRef& ref, const GetOptions& options) {
  core_->check_process("get_async");
  return core_->get_async(ref, options);
}

void TransferAgent::wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout) {
  core_->check_process("wait_tensor_freed");
  core_->wait_tensor_freed(tensor, timeout);
}

TensorView TransferAgent::allocate(size_t bytes, DType dtype) {
  if (bytes % dtype_size(dtype) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "allocate on " + core_->who() + ": " + std::to_string(bytes) +
                    " bytes is not a whole number of " + to_string(dtype) + " elements");
  }
  const std::string name = core_->resolve_transport("auto");
  TensorView bytes_view = core_->transport(name).allocate(bytes, DType::kUInt8);
  return TensorView(bytes_view.data(), dtype, {static_cast<int64_t>(bytes / dtype_size(dtype))});
}

void TransferAgent::deallocate(const TensorView& memory) {
  {
    std::lock_guard<std::mutex> lock(core_->mutex);
    const char* lo = static_cast<const char*>(memory.data());
    const char* hi = lo + memory.nbytes();
    for (const auto& [id, o] : core_->objects) {
      for (const TensorView& t : o.tensors) {
        const char* a = static_cast<const char*>(t.data());
        if (a < hi && lo < a + t.nbytes()) {
          throw Error(ErrorCode::kInvalidUsage,
                      "deallocate on " + core_->who() + ": " + memory.str() + " is still published: " +
                          core_->blockers_locked(o) + "; wait_tensor_freed() first");
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(core_->transports_mutex);
  for (auto& [name, t] : core_->transports) {
    if (t->owns(memory)) {
      t->deallocate(memory);
      return;
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              "deallocate on " + core_->who() + ": " + memory.str() + " did not come from allocate()");
}

void TransferAgent::register_memory(const TensorView& region, int fd, uint64_t fd_offset) {
  if (region.device().type != DeviceType::kCPU || region.data() == nullptr || region.nbytes() == 0) {
    throw Error(ErrorCode::kInvalidArgument, "register_memory on " + core_->who() + ": " +
                                                 region.str() + " is not CPU memory with bytes");
  }
  const std::string name = core_->resolve_transport("auto");
  core_->transport(name).register_memory(region, fd, fd_offset);
}

void TransferAgent::unregister_memory(const TensorView& region) {
  {
    std::lock_guard<std::mutex> lock(core_->mutex);
    const char* lo = static_cast<const char*>(region.data());
    const char* hi = lo + region.nbytes();
    for (const auto& [id, o] : core_->objects) {
      for (const TensorView& t : o.tensors) {
        const char* a = static_cast<const char*>(t.data());
        if (a < hi && lo < a + t.nbytes()) {
          throw Error(ErrorCode::kInvalidUsage,
                      "unregister_memory on " + core_->who() + ": " + region.str() +
                          " is still published: " + core_->blockers_locked(o) +
                          "; wait_tensor_freed() first");
        }
      }
    }
  }
  const std::string name = core_->resolve_transport("auto");
  core_->transport(name).unregister_memory(region);
}

void TransferAgent::abort() noexcept { core_->abort_gets(); }

namespace {

detail::GroupTransport& group_transport(detail::AgentCore& core, std::string_view transport,
                                        const char* op) {
  auto* g = dynamic_cast<detail::GroupTransport*>(&core.transport(std::string(transport)));
  if (g == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + " on " + core.who() +
                                                 ": transport '" + std::string(transport) +
                                                 "' is not two-sided (gloo, nccl)");
  }
  return *g;
}

}  // namespace

void TransferAgent::join_group(std::string_view transport, int world_size, int rank,
                               const GroupOptions& options, std::string_view set) {
  detail::GroupTransport& g = group_transport(*core_, transport, "join_group");
  const std::string name = lower(transport);
  const std::string set_name = std::string(set) + "." + name;
  auto make = [world_size, rank, name, set_name, options](uint64_t incarnation) {
    return CollectiveGroup::create(world_size, rank, name,
                                   set_name + "#" + std::to_string(incarnation), options);
  };
  g.attach(make(g.incarnation() + 1), set_name, make);
}

void TransferAgent::attach_group(std::string_view transport, std::shared_ptr<CollectiveGroup> group) {
  if (!group) {
    throw Error(ErrorCode::kInvalidArgument, "attach_group on " + core_->who() + ": a null group");
  }
  detail::GroupTransport& g = group_transport(*core_, transport, "attach_group");
  if (lower(group->backend_name()) != lower(transport)) {
    throw Error(ErrorCode::kInvalidArgument,
                "attach_group on " + core_->who() + ": " + group->describe() + " runs backend '" +
                    group->backend_name() + "', transport '" + std::string(transport) +
                    "' needs its own");
  }
  const std::string set = group->name();
  g.attach(std::move(group), set, nullptr);
}

void TransferAgent::reset_transport(std::string_view transport) {
  group_transport(*core_, transport, "reset_transport").reset();
}

std::shared_ptr<CollectiveGroup> TransferAgent::transport_group(std::string_view transport) {
  return group_transport(*core_, transport, "transport_group").group();
}

// ---- the process-wide agent ----

std::shared_ptr<TransferAgent> default_agent() {
  static std::mutex m;
  // Never destroyed: its threads may outlive static destruction; the process's exit ends it.
  static auto* agent = new std::shared_ptr<TransferAgent>();
  std::lock_guard<std::mutex> lock(m);
  if (!*agent) *agent = TransferAgent::create();
  return *agent;
}

ObjectHandle put(const std::vector<TensorView>& tensors, const PutOptions& options) {
  return default_agent()->put(tensors, options);
}

Received get(const TensorRef& ref, const GetOptions& options) {
  return default_agent()->get(ref, options);
}

void wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout) {
  default_agent()->wait_tensor_freed(tensor, timeout);
}

}  // namespace tutti
