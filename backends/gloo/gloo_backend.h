// The Gloo backend: CPU tensors over TCP through Debian's Gloo 0.5 (internal).
//
// One Gloo context (and one TCP device with its event-loop thread) per group. The TCP address
// comes from TUTTI_GLOO_IFNAME (an interface, e.g. eth0) or TUTTI_GLOO_HOSTNAME (a host name or
// address to bind), else GLOO_SOCKET_IFNAME, else this host's name when it resolves, else
// 127.0.0.1.
//
// Gloo 0.5 facts this code works around (see shared notes in docs/errors.md): no
// reduce_scatter function (a ring over unbound buffers here), reduce writes every rank's output
// (non-roots reduce into a scratch buffer), no bfloat16 type (tutti's own reduction kernels),
// empty buffers crash (the group skips zero-element ops), mismatched sizes terminate the process
// inside Gloo's I/O thread (the group's per-op tags keep mismatched calls apart).
//
// Threads: the group calls one op at a time; abort() may come from any thread.
#pragma once

#include <memory>
#include <vector>

#include "tutti/backend.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace tutti::gloo_backend {

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(const BackendContext& ctx);
  ~GlooBackend() override;

  const char* name() const override { return "gloo"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }

  void broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                 const OpContext& ctx) override;
  void allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                 const OpContext& ctx) override;
  void reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
              const OpContext& ctx) override;
  void allgather(const std::vector<std::vector<TensorView>>& outputs,
                 const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                 const OpContext& ctx) override;
  void reduce_scatter(const std::vector<TensorView>& outputs,
                      const std::vector<std::vector<TensorView>>& inputs,
                      const ReduceScatterOptions& opts, const OpContext& ctx) override;
  void barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  void send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
            const OpContext& ctx) override;
  void recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
            const OpContext& ctx) override;

 private:
  // A grow-only buffer: large scratch memory is touched once and reused, never allocated per
  // call (first-touch page faults cost ~12 us per 4 KiB here).
  char* scratch(size_t index, size_t bytes);

  int rank_;
  int world_size_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<std::unique_ptr<char[]>> scratch_;
  std::vector<size_t> scratch_size_;
};

}  // namespace tutti::gloo_backend
