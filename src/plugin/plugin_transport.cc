// A plugin's tensor transport (tuttiTransport_v1_t) as a tutti::TensorTransport (internal).
#include <cstring>

#include "plugin/plugin_backend.h"

namespace tutti::detail {
namespace {

// Calls f(buffer, &size, err) with a buffer of `first` bytes, and once more with the size the
// plugin asks for when that was too small (at most `limit`: more calls too_large(size), which
// throws). The buffers are zeroed: a plugin that reports more than it wrote ships zeros, never
// this process's old heap. The answer, as a string.
template <typename F, typename TooLarge>
std::string sized_call(size_t first, size_t limit, const std::string& what, F&& f,
                       TooLarge&& too_large) {
  size_t capacity = first;
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<char[]> buffer(new char[capacity]());
    size_t size = capacity;
    tuttiError_v1_t err{};
    const tuttiResult_t rc = f(buffer.get(), &size, &err);
    if (rc == TUTTI_OK) {
      if (size > capacity) {
        throw Error(ErrorCode::kInternal, what + ": the plugin reports " + std::to_string(size) +
                                              " bytes written into " + std::to_string(capacity));
      }
      return std::string(buffer.get(), size);
    }
    if (rc == TUTTI_ERR_INVALID_ARGUMENT && size > capacity) {
      if (attempt > 0) {
        throw Error(ErrorCode::kInternal, what + ": the plugin asked for a larger buffer twice (" +
                                              std::to_string(size) + " bytes after " +
                                              std::to_string(capacity) + ")");
      }
      if (size > limit) too_large(size);
      capacity = size;
      continue;
    }
    check_plugin(rc, err, what);
  }
}

tuttiAgent_v1_t c_agent(const AgentIdentity& id) {
  tuttiAgent_v1_t a{};
  a.name = id.name.c_str();
  std::memcpy(a.uuid, id.uuid.data(), sizeof(a.uuid));
  a.pid = static_cast<uint32_t>(id.pid);
  return a;
}

// The consumer's side of a fetch, for the plugin's tuttiPeer_v1_t.
struct PeerBridge {
  const FetchRequest& request;
};

class PluginTransport final : public TensorTransport {
 public:
  PluginTransport(std::shared_ptr<PluginLibrary> lib, const tuttiTransport_v1_t* t, void* transport,
                  AgentIdentity agent)
      : lib_(std::move(lib)), t_(t), transport_(transport), agent_(std::move(agent)) {}
  ~PluginTransport() override { t_->destroy(transport_); }

  const char* name() const override { return t_->name; }
  TransportTraits traits() const override {
    TransportTraits traits;
    traits.one_sided = true;  // the agent holds the object at the owner around each fetch
    traits.can_borrow = false;
    traits.cross_host = t_->cross_host != 0;
    traits.cuda = (t_->devices & (1u << TUTTI_DEVICE_CUDA)) != 0;
    return traits;
  }

  Publication publish(const PublishRequest& request) override {
    const auto tensors = to_c(request.tensors);
    Publication pub;
    static_assert(TUTTI_BLOB_MAX == TensorRef::kMaxBlob, "a ref carries what a plugin may write");
    try {
      pub.blob = sized_call(
          TUTTI_BLOB_FIRST, TUTTI_BLOB_MAX, what("publish"),
          [&](void* b, size_t* n, auto* err) {
            return t_->publish(transport_, request.object.id, tensors.data(), tensors.size(), b, n,
                               err);
          },
          [&](size_t needed) {
            throw Error(ErrorCode::kInvalidArgument,
                        what("publish") + ": describing these " + std::to_string(tensors.size()) +
                            " tensors takes " + std::to_string(needed) +
                            " bytes, a ref holds at most " + std::to_string(TUTTI_BLOB_MAX) +
                            " (put fewer tensors per object)");
          });
    } catch (...) {
      // Whatever the plugin kept of the object (a first call's work it asked more room for, or a
      // publication whose answer was refused) goes; for one it does not hold, a no-op (plugin.h).
      if (t_->unpublish != nullptr) t_->unpublish(transport_, request.object.id);
      throw;
    }
    return pub;
  }

  void unpublish(ObjectId object) noexcept override {
    if (t_->unpublish != nullptr) t_->unpublish(transport_, object.id);
  }

  std::string answer(const std::string& request, const AgentIdentity&, std::vector<int>*) override {
    if (t_->answer == nullptr) {
      throw Error(ErrorCode::kUnavailable, what("answer") + ": the transport takes no calls");
    }
    return sized_call(
        1 << 16, size_t(1) << 30, what("answer"),
        [&](void* b, size_t* n, auto* err) {
          return t_->answer(transport_, request.data(), request.size(), b, n, err);
        },
        [&](size_t needed) {
          throw Error(ErrorCode::kInternal, what("answer") + ": the plugin asked for " +
                                                std::to_string(needed) + " bytes of answer");
        });
  }

  FetchResult fetch(const FetchRequest& request) override {
    const auto targets = to_c(request.targets);
    const tuttiAgent_v1_t owner = c_agent(request.owner.owner());
    PeerBridge bridge{request};
    tuttiPeer_v1_t peer{};
    peer.handle = &bridge;
    peer.owner = &owner;
    peer.call = [](void* h, const void* req, size_t size, void* reply, size_t* reply_size,
                   tuttiError_v1_t* err) -> tuttiResult_t {
      auto& b = *static_cast<PeerBridge*>(h);
      try {
        const std::string answer =
            b.request.owner.call(std::string(static_cast<const char*>(req), size));
        const size_t capacity = *reply_size;
        *reply_size = answer.size();
        if (answer.size() > capacity) {
          std::snprintf(err->message, sizeof(err->message),
                        "the owner's answer has %zu bytes, "
                        "the buffer %zu",
                        answer.size(), capacity);
          return TUTTI_ERR_INVALID_ARGUMENT;
        }
        if (!answer.empty()) std::memcpy(reply, answer.data(), answer.size());
        return TUTTI_OK;
      } catch (const std::exception& e) {
        return report(e, err);
      }
    };
    peer.cancelled = [](void* h) -> int32_t {
      return static_cast<PeerBridge*>(h)->request.cancelled.load() ? 1 : 0;
    };
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        request.deadline - std::chrono::steady_clock::now());
    tuttiError_v1_t err{};
    check_plugin(
        t_->fetch(transport_, request.ref.blob().data(), request.ref.blob().size(), targets.data(),
                  targets.size(), &peer, std::max<int64_t>(left.count(), 1), &err),
        err, what("fetch of " + request.ref.describe()));
    return {};
  }

 private:
  std::string what(const std::string& op) const {
    return "plugin '" + lib_->name + "' transport '" + t_->name + "' on agent '" + agent_.name +
           "': " + op;
  }

  std::shared_ptr<PluginLibrary> lib_;
  const tuttiTransport_v1_t* t_;
  void* transport_;
  AgentIdentity agent_;
};

}  // namespace

TransportInfo plugin_transport_info(std::shared_ptr<PluginLibrary> lib,
                                    const tuttiTransport_v1_t* transport) {
  TransportInfo info;
  info.name = transport->name;
  info.priority = transport->priority;
  info.devices = devices_of(transport->devices);
  info.across_hosts = transport->cross_host != 0;
  if (transport->available != nullptr) {
    info.available = [lib, transport] { return transport->available(lib->state) != 0; };
  }
  info.factory = [lib, transport](const TransportContext& ctx) -> std::unique_ptr<TensorTransport> {
    const tuttiAgent_v1_t agent = c_agent(ctx.agent);
    void* handle = nullptr;
    tuttiError_v1_t err{};
    check_plugin(transport->create(lib->state, &agent, &handle, &err), err,
                 "plugin '" + lib->name + "' transport '" + transport->name + "' on agent '" +
                     ctx.agent.name + "': create");
    return std::make_unique<PluginTransport>(lib, transport, handle, ctx.agent);
  };
  return info;
}

}  // namespace tutti::detail
