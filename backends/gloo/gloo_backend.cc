#include "gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gloo_store.h"
#include "gloo_util.h"
#include "logging.h"
#include "reduction.h"
#include "tensor_list.h"
#include "tutti/error.h"

namespace tutti::gloo_backend {
namespace {

// Slot prefixes of tutti's own algorithms; Gloo's functions use 0x01..0x0b.
constexpr uint8_t kSendRecvSlotPrefix = 0xe1;
constexpr uint8_t kReduceScatterSlotPrefix = 0xe2;

// Runs a Gloo call and turns Gloo's exceptions into tutti::Error naming the op.
template <typename Fn>
void guarded(const OpContext& ctx, const std::string& waiting_for, Fn&& fn) {
  try {
    fn();
  } catch (const ::gloo::IoException& e) {
    const std::string msg = e.what();
    if (msg.find("Timed out") != std::string::npos) {
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for " + waiting_for + " (gloo: " + msg +
                                           ")");
    }
    throw Error(ErrorCode::kIoError, ctx.description() + ": transport error while exchanging with " +
                                         waiting_for + " (gloo: " + msg + ")");
  } catch (const ::gloo::EnforceNotMet& e) {
    throw Error(ErrorCode::kInternal, ctx.description() + ": gloo check failed: " + e.what());
  } catch (const ::gloo::Exception& e) {
    throw Error(ErrorCode::kInternal, ctx.description() + ": gloo: " + e.what());
  }
}

std::string everyone(int world_size) {
  return "the other " + std::to_string(world_size - 1) + " rank(s) of the group";
}


::gloo::AllreduceOptions::Func gloo_reduce_fn(DType dtype, ReduceOp op) {
  detail::ReduceFn fn = detail::reduce_function(dtype, op);
  if (fn == nullptr) {
    throw Error(ErrorCode::kInternal, std::string("gloo: no reduction for ") + to_string(dtype) +
                                          " " + to_string(op));
  }
  return [fn](void* out, const void* a, const void* b, size_t n) { fn(out, a, b, n); };
}


}  // namespace

GlooBackend::GlooBackend(const BackendContext& ctx)
    : rank_(ctx.rank), world_size_(ctx.world_size) {
  if (world_size_ == 1) return;  // every op is local: no device, no threads
  try {
    device_ = ::gloo::transport::tcp::CreateDevice(device_attr());
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank_, world_size_);
    context->setTimeout(ctx.timeout);
    GlooStore store(ctx.store);
    context->connectFullMesh(store, device_);
    context_ = std::move(context);
  } catch (const ::gloo::IoException& e) {
    const std::string msg = e.what();
    const ErrorCode code =
        msg.find("Timed out") != std::string::npos ? ErrorCode::kTimeout : ErrorCode::kIoError;
    throw Error(code, "connecting to the other ranks failed (gloo: " + msg + ")");
  } catch (const ::gloo::EnforceNotMet& e) {
    throw Error(ErrorCode::kIoError, std::string("connecting to the other ranks failed (gloo: ") +
                                         e.what() + ")");
  } catch (const ::gloo::Exception& e) {
    throw Error(ErrorCode::kIoError, std::string("connecting to the other ranks failed (gloo: ") +
                                         e.what() + ")");
  }
}

GlooBackend::~GlooBackend() {
  // The context's pairs go first, then the device and its event loop thread.
  context_.reset();
  device_.reset();
}

char* GlooBackend::scratch(size_t index, size_t bytes) {
  if (scratch_.size() <= index) {
    scratch_.resize(index + 1);
    scratch_size_.resize(index + 1, 0);
  }
  if (scratch_size_[index] < bytes) {
    scratch_[index].reset();  // release before allocating: large buffers are not kept twice
    scratch_[index].reset(new char[bytes]);
    scratch_size_[index] = bytes;
  }
  return scratch_[index].get();
}

void GlooBackend::allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                            const OpContext& ctx) {
  const TensorView& t = tensors[0];
  if (world_size_ > 1) {
    guarded(ctx, everyone(world_size_), [&] {
      ::gloo::AllreduceOptions o(context_);
      with_word(t.element_size(), [&](auto word) {
        using W = decltype(word);
        o.setOutput<W>(static_cast<W*>(t.data()), static_cast<size_t>(t.numel()));
      });
      o.setReduceFunction(gloo_reduce_fn(t.dtype(), opts.reduce_op));
      o.setTag(ctx.tag);
      o.setTimeout(ctx.timeout);
      ::gloo::allreduce(o);
    });
  }
  if (opts.reduce_op == ReduceOp::kAvg) {
    detail::scale_average(t.data(), t.dtype(), static_cast<size_t>(t.numel()), world_size_);
  }
}

void GlooBackend::reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                         const OpContext& ctx) {
  const TensorView& t = tensors[0];
  const bool root = rank_ == opts.root_rank;
  if (world_size_ > 1) {
    guarded(ctx, everyone(world_size_), [&] {
      ::gloo::ReduceOptions o(context_);
      with_word(t.element_size(), [&](auto word) {
        using W = decltype(word);
        const size_t n = static_cast<size_t>(t.numel());
        o.setInput<W>(static_cast<W*>(t.data()), n);
        // Gloo writes every rank's output: only the root's may be the caller's tensor.
        o.setOutput<W>(root ? static_cast<W*>(t.data())
                            : reinterpret_cast<W*>(scratch(0, t.nbytes())),
                       n);
      });
      o.setRoot(opts.root_rank);
      o.setReduceFunction(gloo_reduce_fn(t.dtype(), opts.reduce_op));
      o.setTag(ctx.tag);
      o.setTimeout(ctx.timeout);
      ::gloo::reduce(o);
    });
  }
  if (root && opts.reduce_op == ReduceOp::kAvg) {
    detail::scale_average(t.data(), t.dtype(), static_cast<size_t>(t.numel()), world_size_);
  }
}

void GlooBackend::broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                            const OpContext& ctx) {
  if (world_size_ == 1) return;
  const TensorView& t = tensors[0];
  guarded(ctx, rank_ == opts.root_rank ? everyone(world_size_)
                                       : "root rank " + std::to_string(opts.root_rank),
          [&] {
            ::gloo::BroadcastOptions o(context_);
            with_word(t.element_size(), [&](auto word) {
              using W = decltype(word);
              o.setOutput<W>(static_cast<W*>(t.data()), static_cast<size_t>(t.numel()));
            });
            o.setRoot(opts.root_rank);
            o.setTag(ctx.tag);
            o.setTimeout(ctx.timeout);
            ::gloo::broadcast(o);
          });
}

void GlooBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                            const std::vector<TensorView>& inputs, const AllgatherOptions&,
                            const OpContext& ctx) {
  const TensorView& in = inputs[0];
  const std::vector<TensorView>& out = outputs[0];
  const size_t bytes = in.nbytes();
  if (world_size_ == 1) {
    if (out[0].data() != in.data()) std::memcpy(out[0].data(), in.data(), bytes);
    return;
  }
  const bool direct = detail::back_to_back(out);
  char* dst = direct ? static_cast<char*>(out[0].data()) : scratch(0, bytes * world_size_);
  // In place when the caller's input already is this rank's slot of the output.
  const bool in_place = direct && out[rank_].data() == in.data();
  guarded(ctx, everyone(world_size_), [&] {
    ::gloo::AllgatherOptions o(context_);
    with_word(in.element_size(), [&](auto word) {
      using W = decltype(word);
      const size_t n = static_cast<size_t>(in.numel());
      if (!in_place) o.setInput<W>(static_cast<W*>(in.data()), n);
      o.setOutput<W>(reinterpret_cast<W*>(dst), n * static_cast<size_t>(world_size_));
    });
    o.setTag(ctx.tag);
    o.setTimeout(ctx.timeout);
    ::gloo::allgather(o);
  });
  if (!direct) {
    for (int r = 0; r < world_size_; ++r) std::memcpy(out[r].data(), dst + r * bytes, bytes);
  }
}

void GlooBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                 const std::vector<std::vector<TensorView>>& inputs,
                                 const ReduceScatterOptions& opts, const OpContext& ctx) {
  const TensorView& out = outputs[0];
  const std::vector<TensorView>& in = inputs[0];
  const size_t bytes = out.nbytes();
  const size_t n = static_cast<size_t>(out.numel());
  const int w = world_size_;
  if (w == 1) {
    if (out.data() != in[0].data()) std::memcpy(out.data(), in[0].data(), bytes);
  } else {
    // A ring: at step s this rank sends its running sum of block (rank - s - 1) to the right
    // and receives the left neighbour's running sum of block (rank - s - 2), adding its own
    // input. After w - 1 steps the block received is its own, fully reduced, written straight
    // into the output. Two accumulators alternate so the one being sent is never overwritten.
    const detail::ReduceFn fn = detail::reduce_function(out.dtype(), opts.reduce_op);
    char* incoming = scratch(0, bytes);
    char* acc[2] = {scratch(1, bytes), scratch(2, bytes)};
    const int right = (rank_ + 1) % w;
    const int left = (rank_ - 1 + w) % w;
    const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, ctx.tag);
    guarded(ctx, "rank " + std::to_string(left) + " (ring neighbour)", [&] {
      auto recv_buf = context_->createUnboundBuffer(incoming, bytes);
      const void* sending = in[(rank_ - 1 + w) % w].data();
      for (int s = 0; s < w - 1; ++s) {
        auto send_buf = context_->createUnboundBuffer(const_cast<void*>(sending), bytes);
        send_buf->send(right, slot);
        recv_buf->recv(left, slot);
        if (!recv_buf->waitRecv(ctx.timeout) || !send_buf->waitSend(ctx.timeout)) {
          throw Error(ErrorCode::kAborted, ctx.description() + ": aborted");
        }
        const int block = ((rank_ - s - 2) % w + w) % w;
        char* target = (s == w - 2) ? static_cast<char*>(out.data()) : acc[s % 2];
        fn(target, in[block].data(), incoming, n);
        sending = target;
      }
    });
  }
  if (opts.reduce_op == ReduceOp::kAvg) detail::scale_average(out.data(), out.dtype(), n, w);
}

void GlooBackend::barrier(const BarrierOptions&, const OpContext& ctx) {
  if (world_size_ == 1) return;
  guarded(ctx, everyone(world_size_), [&] {
    ::gloo::BarrierOptions o(context_);
    o.setTag(ctx.tag);
    o.setTimeout(ctx.timeout);
    ::gloo::barrier(o);
  });
}

void GlooBackend::send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions&,
                       const OpContext& ctx) {
  const TensorView& t = tensors[0];
  guarded(ctx, "rank " + std::to_string(dst_rank) + " to receive", [&] {
    auto buf = context_->createUnboundBuffer(t.data(), t.nbytes());
    buf->send(dst_rank, ::gloo::Slot::build(kSendRecvSlotPrefix, ctx.tag));
    if (!buf->waitSend(ctx.timeout)) throw Error(ErrorCode::kAborted, ctx.description() + ": aborted");
  });
}

void GlooBackend::recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions&,
                       const OpContext& ctx) {
  const TensorView& t = tensors[0];
  guarded(ctx, "rank " + std::to_string(src_rank) + " to send", [&] {
    auto buf = context_->createUnboundBuffer(t.data(), t.nbytes());
    buf->recv(src_rank, ::gloo::Slot::build(kSendRecvSlotPrefix, ctx.tag));
    if (!buf->waitRecv(ctx.timeout)) throw Error(ErrorCode::kAborted, ctx.description() + ": aborted");
  });
}

}  // namespace tutti::gloo_backend
