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
// Allreduces and barriers go over a second context whose sockets tutti reads and writes itself
// (gloo_direct_exchange.h), in groups of up to 64 ranks: allreduces of up to
// TUTTI_GLOO_DIRECT_BYTES (default 128 KiB at 2 and 4 ranks, 64 KiB at 8, 16..., 32 KiB at 3,
// 8 KiB at other sizes) in one step (every rank sends its data to every other) or, at 4, 8,
// 16... ranks, by recursive doubling; larger ones through a ring that folds data in as it
// arrives. TUTTI_GLOO_ALLREDUCE=direct|
// doubling|ring forces one of them, =gloo uses Gloo's own functions (and makes no second
// context).
//
// abort() resets the context's connections (see gloo_connections.h): the op waiting in Gloo
// ends at once with kAborted, and a peer waiting on this rank fails at once too (kIoError naming
// the rank whose connection reset). SIGPIPE, which a write to a peer that
// died would raise, is ignored once a Gloo group exists (unless the program installed its own
// handler): the write fails instead, and the op reports the peer.
//
// Threads: the group calls one op at a time; abort() may come from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gloo_connections.h"
#include "gloo_direct_exchange.h"
#include "tutti/backend.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace tutti::gloo_backend {

// How allreduce chooses its algorithm (TUTTI_GLOO_ALLREDUCE).
enum class GlooAllreduce { kAuto, kDirect, kDoubling, kRing, kGloo };

class GlooBackend : public Backend {
 public:
  explicit GlooBackend(const BackendContext& ctx);
  ~GlooBackend() override;

  const char* name() const override { return "gloo"; }
  bool supports_device(DeviceType type) const override { return type == DeviceType::kCPU; }

  WorkPtr broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                 const OpContext& ctx) override;
  WorkPtr allgather(const std::vector<std::vector<TensorView>>& outputs,
                    const std::vector<TensorView>& inputs, const AllgatherOptions& opts,
                    const OpContext& ctx) override;
  WorkPtr reduce_scatter(const std::vector<TensorView>& outputs,
                         const std::vector<std::vector<TensorView>>& inputs,
                         const ReduceScatterOptions& opts, const OpContext& ctx) override;
  WorkPtr barrier(const BarrierOptions& opts, const OpContext& ctx) override;
  WorkPtr send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions& opts,
               const OpContext& ctx) override;
  WorkPtr recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions& opts,
               const OpContext& ctx) override;
  WorkPtr allgather_into(const TensorView& output, const TensorView& input,
                         const AllgatherOptions& opts, const OpContext& ctx) override;
  WorkPtr batch_p2p(const std::vector<P2PRequest>& requests, const BatchP2POptions& opts,
                    const OpContext& ctx) override;
  void abort(const std::string& reason) override;

 private:
  // Runs a Gloo call, turning Gloo's exceptions into tutti::Error naming the op and, where
  // Gloo's message names a peer's address, the rank; kAborted once abort() was called.
  template <typename Fn>
  void guarded(const OpContext& ctx, const std::string& waiting_for, Fn&& fn);
  [[noreturn]] void throw_aborted(const OpContext& ctx) const;
  void allgather_buffer(char* output, const TensorView& input, bool in_place, const OpContext& ctx);
  // Waits for an unbound buffer's send or receive, which abort() can end early.
  void wait_buffer(::gloo::transport::UnboundBuffer& buffer, bool sending, int peer,
                   std::chrono::steady_clock::time_point deadline, const OpContext& ctx);
  // A grow-only buffer: large scratch memory is touched once and reused, never allocated per
  // call (first-touch page faults cost ~12 us per 4 KiB here).
  char* scratch(size_t index, size_t bytes);

  int rank_;
  int world_size_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<std::unique_ptr<char[]>> scratch_;
  std::vector<size_t> scratch_size_;
  GlooConnections connections_;
  std::unique_ptr<DirectExchange> direct_;  // null: one rank, too many, or kGloo
  size_t direct_limit_ = 0;  // kAuto: allreduces up to this many bytes take the direct exchange
  GlooAllreduce algorithm_ = GlooAllreduce::kAuto;

  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;  // guards reason_ and waiting_
  std::string reason_;
  std::set<::gloo::transport::UnboundBuffer*> waiting_;  // buffers an op waits on now
};

}  // namespace tutti::gloo_backend
