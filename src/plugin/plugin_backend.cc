// A plugin's collective backend (tuttiBackend_v1_t) as a tutti::Backend (internal).
#include "plugin/plugin_backend.h"

#include <cstring>
#include <thread>

#include "plugin/plugin_abi.h"
#include "tutti/store.h"

namespace tutti::detail {
namespace {

// tutti's Store as the C ABI's, for a backend's create.
tuttiStore_v1_t c_store(Store& store) {
  tuttiStore_v1_t s{};
  s.handle = &store;
  s.set = [](void* h, const char* key, const void* value, size_t size,
             tuttiError_v1_t* err) -> tuttiResult_t {
    try {
      static_cast<Store*>(h)->set(key, std::string(static_cast<const char*>(value), size));
      return TUTTI_OK;
    } catch (const std::exception& e) {
      return report(e, err);
    }
  };
  s.get = [](void* h, const char* key, void* buffer, size_t* size, int64_t timeout_ms,
             tuttiError_v1_t* err) -> tuttiResult_t {
    try {
      auto& st = *static_cast<Store*>(h);
      st.wait({key}, std::chrono::milliseconds(timeout_ms));
      const std::string v = st.get(key);
      const size_t capacity = *size;
      *size = v.size();
      if (v.size() > capacity) {
        std::snprintf(err->message, sizeof(err->message),
                      "store key '%s' holds %zu bytes, the buffer %zu", key, v.size(), capacity);
        return TUTTI_ERR_INVALID_ARGUMENT;
      }
      if (!v.empty()) std::memcpy(buffer, v.data(), v.size());
      return TUTTI_OK;
    } catch (const std::exception& e) {
      return report(e, err);
    }
  };
  s.add = [](void* h, const char* key, int64_t delta, int64_t* result,
             tuttiError_v1_t* err) -> tuttiResult_t {
    try {
      *result = static_cast<Store*>(h)->add(key, delta);
      return TUTTI_OK;
    } catch (const std::exception& e) {
      return report(e, err);
    }
  };
  s.wait = [](void* h, const char* const* keys, size_t count, int64_t timeout_ms,
              tuttiError_v1_t* err) -> tuttiResult_t {
    try {
      static_cast<Store*>(h)->wait(std::vector<std::string>(keys, keys + count),
                                   std::chrono::milliseconds(timeout_ms));
      return TUTTI_OK;
    } catch (const std::exception& e) {
      return report(e, err);
    }
  };
  return s;
}

tuttiOp_v1_t c_op(const OpContext& ctx, const std::string& what, void* stream) {
  tuttiOp_v1_t op{};
  op.seq = ctx.seq;
  op.tag = ctx.tag;
  op.timeout_ms = ctx.timeout.count();
  op.what = what.c_str();
  op.stream = stream;
  return op;
}

tuttiReduceOp_t c_reduce(ReduceOp op) {
  return static_cast<tuttiReduceOp_t>(static_cast<int>(op));
}

// The group's store as the plugin holds it: alive, at one address, as long as the backend.
struct HeldStore {
  std::shared_ptr<Store> store;
  tuttiStore_v1_t c{};
};

class PluginBackend final : public Backend {
 public:
  PluginBackend(std::shared_ptr<PluginLibrary> lib, const tuttiBackend_v1_t* backend, void* comm,
                std::unique_ptr<HeldStore> store)
      : lib_(std::move(lib)), b_(backend), comm_(comm), store_(std::move(store)) {}
  ~PluginBackend() override { b_->destroy(comm_); }

  const char* name() const override { return b_->name; }

  bool supports(OpType op) const override {
    switch (op) {
      case OpType::kAllreduce: return b_->allreduce != nullptr;
      case OpType::kBroadcast: return b_->broadcast != nullptr;
      case OpType::kReduce: return b_->reduce != nullptr;
      case OpType::kAllgather: return b_->allgather != nullptr;
      case OpType::kReduceScatter: return b_->reduce_scatter != nullptr;
      case OpType::kBarrier: return b_->barrier != nullptr;
      default: return b_->send != nullptr && b_->recv != nullptr;  // point to point and derived
    }
  }
  bool supports_device(DeviceType type) const override {
    return (b_->devices &
            (1u << (type == DeviceType::kCUDA ? TUTTI_DEVICE_CUDA : TUTTI_DEVICE_CPU))) != 0;
  }

  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override {
    const auto t = to_c(tensors[0]);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->allreduce(comm_, &t, c_reduce(opts.reduce_op), op, err);
    });
  }
  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override {
    const auto t = to_c(tensors[0]);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->broadcast(comm_, &t, opts.root_rank, op, err);
    });
  }
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override {
    const auto t = to_c(tensors[0]);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->reduce(comm_, &t, c_reduce(opts.reduce_op), opts.root_rank, op, err);
    });
  }
  WorkPtr allgather_into(const TensorView& output, const TensorView& input,
                         const AllgatherOptions& opts, const OpContext& ctx) override {
    const auto out = to_c(output);
    const auto in = to_c(input);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->allgather(comm_, &out, &in, op, err);
    });
  }
  // The list form through one buffer: the plugin's allgather, then a copy out.
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override {
    const TensorView& in = inputs[0];
    std::vector<char> buffer(in.nbytes() * outputs[0].size());
    const TensorView flat(buffer.data(), in.dtype(),
                          {in.numel() * static_cast<int64_t>(outputs[0].size())}, in.device());
    allgather_into(flat, in, opts, ctx);
    for (size_t r = 0; r < outputs[0].size(); ++r) {
      std::memcpy(outputs[0][r].data(), buffer.data() + r * in.nbytes(), in.nbytes());
    }
    return nullptr;
  }
  WorkPtr reduce_scatter_from(const TensorView& output, const TensorView& input,
                              const ReduceScatterOptions& opts, const OpContext& ctx) override {
    const auto out = to_c(output);
    const auto in = to_c(input);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->reduce_scatter(comm_, &out, &in, c_reduce(opts.reduce_op), op, err);
    });
  }
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override {
    const TensorView& out = outputs[0];
    std::vector<char> buffer(out.nbytes() * inputs[0].size());
    for (size_t r = 0; r < inputs[0].size(); ++r) {
      std::memcpy(buffer.data() + r * out.nbytes(), inputs[0][r].data(), out.nbytes());
    }
    const TensorView flat(buffer.data(), out.dtype(),
                          {out.numel() * static_cast<int64_t>(inputs[0].size())}, out.device());
    return reduce_scatter_from(out, flat, opts, ctx);
  }
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override {
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->barrier(comm_, op, err);
    });
  }
  WorkPtr send(const std::vector<TensorView>& tensors, int dst, const SendOptions& opts,
               const OpContext& ctx) override {
    const auto t = to_c(tensors[0]);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->send(comm_, &t, dst, op, err);
    });
  }
  WorkPtr recv(const std::vector<TensorView>& tensors, int src, const RecvOptions& opts,
               const OpContext& ctx) override {
    const auto t = to_c(tensors[0]);
    return call(ctx, opts.stream, [&](const tuttiOp_v1_t* op, tuttiError_v1_t* err) {
      return b_->recv(comm_, &t, src, op, err);
    });
  }
  // Sends on a thread of their own while this one receives, each side in request order: a
  // plugin's blocking send and recv then cannot wait on each other around a ring.
  WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                    const OpContext& ctx) override {
    std::exception_ptr send_error;
    std::thread sender([&] {
      try {
        for (const auto& r : requests) {
          if (r.kind == P2POp::Kind::kSend) send({r.tensor}, r.peer, SendOptions(), ctx);
        }
      } catch (...) {
        send_error = std::current_exception();
        abort("a send of the batch failed");
      }
    });
    std::exception_ptr recv_error;
    try {
      for (const auto& r : requests) {
        if (r.kind == P2POp::Kind::kRecv) recv({r.tensor}, r.peer, RecvOptions(), ctx);
      }
    } catch (...) {
      recv_error = std::current_exception();
      abort("a receive of the batch failed");
    }
    sender.join();
    (void)opts;
    if (send_error) std::rethrow_exception(send_error);
    if (recv_error) std::rethrow_exception(recv_error);
    return nullptr;
  }

  void abort(const std::string& reason) override { b_->abort(comm_, reason.c_str()); }

 private:
  template <typename F>
  WorkPtr call(const OpContext& ctx, void* stream, F&& f) {
    const std::string what = ctx.description();
    const tuttiOp_v1_t op = c_op(ctx, what, stream);
    tuttiError_v1_t err{};
    check_plugin(f(&op, &err), err,
                 what + ": plugin '" + lib_->name + "' backend '" + b_->name + "'");
    return nullptr;
  }

  std::shared_ptr<PluginLibrary> lib_;
  const tuttiBackend_v1_t* b_;
  void* comm_;
  std::unique_ptr<HeldStore> store_;  // the plugin may use it until destroy
};

}  // namespace

BackendInfo plugin_backend_info(std::shared_ptr<PluginLibrary> lib,
                                const tuttiBackend_v1_t* backend) {
  BackendInfo info;
  info.name = backend->name;
  info.scope = backend->scope == TUTTI_SCOPE_ONE_HOST ? BackendInfo::Scope::kOneHost
                                                      : BackendInfo::Scope::kAnyHost;
  info.priority = backend->priority;
  info.devices = devices_of(backend->devices);
  if (backend->available != nullptr) {
    info.available = [lib, backend] { return backend->available(lib->state) != 0; };
  }
  info.factory = [lib, backend](const BackendContext& ctx) -> std::unique_ptr<Backend> {
    auto store = std::make_unique<HeldStore>();
    store->store = ctx.store;
    store->c = c_store(*store->store);
    std::vector<const char*> hosts;
    for (const auto& h : ctx.hosts) hosts.push_back(h.c_str());
    tuttiBackendArgs_v1_t args{};
    args.group_name = ctx.group_name.c_str();
    args.instance = ctx.instance.c_str();
    args.rank = ctx.rank;
    args.world_size = ctx.world_size;
    args.timeout_ms = ctx.timeout.count();
    args.store = &store->c;
    args.hosts = hosts.data();
    void* comm = nullptr;
    tuttiError_v1_t err{};
    check_plugin(backend->create(lib->state, &args, &comm, &err), err,
                 "group '" + ctx.group_name + "' (rank " + std::to_string(ctx.rank) + "/" +
                     std::to_string(ctx.world_size) + "): plugin '" + lib->name + "' backend '" +
                     backend->name + "': create");
    return std::make_unique<PluginBackend>(lib, backend, comm, std::move(store));
  };
  return info;
}

}  // namespace tutti::detail
