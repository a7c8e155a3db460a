// TransferAgent's public face: ObjectHandle, Borrowed, Fetch, the agent's calls, the two-sided
// transports' groups and the process-wide agent (transport_registry.cc: the transports).
#include "tutti/transfer_agent.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include "transfer/agent_core.h"
#include "transfer/group_transport.h"
#include "tutti/backend.h"
#include "tutti/collective_group.h"
#include "tutti/embedding.h"
#include "util/fork_watch.h"
#include "util/logging.h"

namespace tutti {

// ---- ObjectHandle, Borrowed, Fetch ----

const TensorRef& ObjectHandle::ref() const {
  if (!pin_)
    throw Error(ErrorCode::kInvalidUsage, "ObjectHandle::ref on an empty or released handle");
  return pin_->ref;
}

void ObjectHandle::release() {
  pin_.reset();
}

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
Borrowed::~Borrowed() {
  release();
}

void Borrowed::release() noexcept {
  views_.clear();
  lease_.reset();
}

bool Fetch::is_completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}

Received Fetch::wait(std::chrono::milliseconds timeout) {
  if (!state_) throw Error(ErrorCode::kInvalidUsage, "Fetch::wait on an empty Fetch");
  if (timeout.count() < 0 && timeout != kUseGroupTimeout) {
    throw Error(ErrorCode::kInvalidArgument,
                "Fetch::wait: timeout must be kUseGroupTimeout or >= 0, got " +
                    std::to_string(timeout.count()) + " ms");
  }
  std::unique_lock<std::mutex> lock(state_->mutex);
  // kUseGroupTimeout: the get's own deadline bounds it. Naps of at most a second, clear of the
  // clock's limits for a huge timeout.
  const auto deadline = timeout == kUseGroupTimeout ? detail::Clock::time_point::max()
                                                    : detail::deadline_after(timeout);
  while (!state_->finished) {
    if (detail::Clock::now() >= deadline) {
      throw Error(ErrorCode::kTimeout, "Fetch::wait: the " + state_->what + " still runs after " +
                                           std::to_string(timeout.count()) +
                                           " ms (it goes on: wait again, or cancel it)");
    }
    state_->cv.wait_until(lock, std::min(deadline, detail::Clock::now() + std::chrono::seconds(1)));
  }
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->result;
}

std::exception_ptr Fetch::exception() const {
  if (!state_) return nullptr;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished ? state_->error : nullptr;
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
  const detail::BlockingScope blocking;  // the stop may wait (collective_group.cc's destroy says)
  core_->stop();
}

const AgentIdentity& TransferAgent::identity() const {
  return core_->identity;
}

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
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + " on " + core.who() +
                                                 ": the handle is for " + handle.ref().describe() +
                                                 ", another agent's object");
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

ObjectHandle TransferAgent::reserve(const std::vector<TensorMeta>& metas,
                                    const PutOptions& options) {
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
  const std::string name = core_->resolve_transport("auto", DeviceType::kCPU);
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
                      "deallocate on " + core_->who() + ": " + memory.str() +
                          " is still published: " + core_->blockers_locked(o) +
                          "; wait_tensor_freed() first");
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
  throw Error(ErrorCode::kInvalidArgument, "deallocate on " + core_->who() + ": " + memory.str() +
                                               " did not come from allocate()");
}

void TransferAgent::register_memory(const TensorView& region, int fd, uint64_t fd_offset) {
  if (region.device().type != DeviceType::kCPU || region.data() == nullptr ||
      region.nbytes() == 0) {
    throw Error(ErrorCode::kInvalidArgument, "register_memory on " + core_->who() + ": " +
                                                 region.str() + " is not CPU memory with bytes");
  }
  const std::string name = core_->resolve_transport("auto", DeviceType::kCPU);
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
  const std::string name = core_->resolve_transport("auto", DeviceType::kCPU);
  core_->transport(name).unregister_memory(region);
}

void TransferAgent::abort() noexcept {
  core_->abort_gets();
}

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
  const std::string name = detail::transport_key(transport);
  const std::string set_name = std::string(set) + "." + name;
  auto make = [world_size, rank, name, set_name, options](uint64_t incarnation) {
    return CollectiveGroup::create(world_size, rank, name,
                                   set_name + "#" + std::to_string(incarnation), options);
  };
  g.attach(make(g.incarnation() + 1), set_name, make);
}

void TransferAgent::attach_group(std::string_view transport,
                                 std::shared_ptr<CollectiveGroup> group) {
  if (!group) {
    throw Error(ErrorCode::kInvalidArgument, "attach_group on " + core_->who() + ": a null group");
  }
  detail::GroupTransport& g = group_transport(*core_, transport, "attach_group");
  if (detail::transport_key(group->backend_name()) != detail::transport_key(transport)) {
    throw Error(ErrorCode::kInvalidArgument, "attach_group on " + core_->who() + ": " +
                                                 group->describe() + " runs backend '" +
                                                 group->backend_name() + "', transport '" +
                                                 std::string(transport) + "' needs its own");
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

namespace {
std::mutex default_agent_mutex;
// Never destroyed: its threads may outlive static destruction; the process's exit ends it.
std::shared_ptr<TransferAgent>* const default_agent_slot = new std::shared_ptr<TransferAgent>();
}  // namespace

bool default_agent_made() {
  std::lock_guard<std::mutex> lock(default_agent_mutex);
  return *default_agent_slot != nullptr;
}

std::shared_ptr<TransferAgent> default_agent() {
  std::lock_guard<std::mutex> lock(default_agent_mutex);
  std::shared_ptr<TransferAgent>& agent = *default_agent_slot;
  if (!agent) {
    // TUTTI_TRANSFER_LISTEN_TCP serves consumers on other hosts: "1" on the default address, or
    // the address to listen on and publish.
    TransferAgentOptions o;
    const char* tcp = std::getenv("TUTTI_TRANSFER_LISTEN_TCP");
    if (tcp != nullptr && *tcp != '\0' && std::string(tcp) != "0") {
      o.listen_tcp = true;
      if (std::string(tcp) != "1") o.tcp_host = tcp;
    }
    agent = TransferAgent::create(o);
  }
  return agent;
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
