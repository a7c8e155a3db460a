#include "raw_gloo.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>

#include "gloo_store.h"
#include "gloo_util.h"
#include "tutti/error.h"

namespace tutti::bench {

namespace {
using Fn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
Fn gloo_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &::gloo::sum<T>;
    case ReduceOp::kProduct: return &::gloo::product<T>;
    case ReduceOp::kMin: return &::gloo::min<T>;
    case ReduceOp::kMax: return &::gloo::max<T>;
    default: return nullptr;
  }
}

Fn reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kInt8: return gloo_fn<int8_t>(op);
    case DType::kUInt8: return gloo_fn<uint8_t>(op);
    case DType::kInt32: return gloo_fn<int32_t>(op);
    case DType::kInt64: return gloo_fn<int64_t>(op);
    case DType::kUInt64: return gloo_fn<uint64_t>(op);
    case DType::kFloat32: return gloo_fn<float>(op);
    case DType::kFloat64: return gloo_fn<double>(op);
    default: return nullptr;
  }
}
}  // namespace

struct RawGloo::Impl {
  Config config;
  int rank = 0;
  int world = 1;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  Fn fn = nullptr;
  uint32_t tag = 0;
};

std::string RawGloo::unsupported_reason(const Config& c) {
  if (c.op == BenchOp::kReduceScatter) return "Gloo 0.5 has no reduce_scatter function";
  const bool reducing = c.op == BenchOp::kAllreduce || c.op == BenchOp::kReduce;
  if (reducing && reduce_fn(c.dtype, c.redop) == nullptr) {
    return std::string("Gloo has no ") + tutti::to_string(c.redop) + " reduction for " +
           tutti::to_string(c.dtype);
  }
  return "";
}

RawGloo::RawGloo(std::shared_ptr<Store> store, int rank, int world_size, const Config& config)
    : impl_(std::make_unique<Impl>()) {
  const std::string why = unsupported_reason(config);
  if (!why.empty()) throw Error(ErrorCode::kUnavailable, "--baseline: " + why);
  impl_->config = config;
  impl_->rank = rank;
  impl_->world = world_size;
  impl_->fn = reduce_fn(config.dtype, config.redop);
  if (world_size == 1) return;
  impl_->device = ::gloo::transport::tcp::CreateDevice(gloo_backend::device_attr());
  impl_->context = std::make_shared<::gloo::rendezvous::Context>(rank, world_size);
  impl_->context->setTimeout(std::chrono::seconds(60));
  gloo_backend::GlooStore adapter(store);
  impl_->context->connectFullMesh(adapter, impl_->device);
}

RawGloo::~RawGloo() = default;

void RawGloo::run(void* in, void* out, void* scratch, int64_t per_rank, bool in_place) {
  Impl& m = *impl_;
  if (m.world == 1) return;
  const size_t es = dtype_size(m.config.dtype);
  const size_t n = static_cast<size_t>(per_rank);
  const uint32_t tag = m.tag++;
  // Gloo's setters are typed only for the element width.
  auto as = [&](void* p) { return static_cast<uint8_t*>(p); };
  switch (m.config.op) {
    case BenchOp::kAllreduce:
      // Typed by element width, so that Gloo's segments never split an element.
      gloo_backend::with_word(es, [&](auto word) {
        using W = decltype(word);
        ::gloo::AllreduceOptions o(m.context);
        o.setOutput(static_cast<W*>(out), n);
        o.setReduceFunction(m.fn);
        o.setTag(tag);
        ::gloo::allreduce(o);
      });
      break;
    case BenchOp::kBroadcast: {
      ::gloo::BroadcastOptions o(m.context);
      o.setOutput(as(out), n * es);
      o.setRoot(m.config.root);
      o.setTag(tag);
      ::gloo::broadcast(o);
      break;
    }
    case BenchOp::kReduce:
      gloo_backend::with_word(es, [&](auto word) {
        using W = decltype(word);
        ::gloo::ReduceOptions o(m.context);
        o.setInput(static_cast<W*>(out), n);
        o.setOutput(static_cast<W*>(m.rank == m.config.root ? out : scratch), n);
        o.setRoot(m.config.root);
        o.setReduceFunction(m.fn);
        o.setTag(tag);
        ::gloo::reduce(o);
      });
      break;
    case BenchOp::kAllgather: {
      ::gloo::AllgatherOptions o(m.context);
      if (!in_place) o.setInput(as(in), n * es);
      o.setOutput(as(out), n * es * m.world);
      o.setTag(tag);
      ::gloo::allgather(o);
      break;
    }
    case BenchOp::kBarrier: {
      ::gloo::BarrierOptions o(m.context);
      o.setTag(tag);
      ::gloo::barrier(o);
      break;
    }
    case BenchOp::kSendRecv: {
      if (m.rank > 1) break;
      const auto slot = ::gloo::Slot::build(0x0f, tag);
      auto send = m.context->createUnboundBuffer(in, n * es);
      auto recv = m.context->createUnboundBuffer(out, n * es);
      if (m.rank == 0) {
        send->send(1, slot);
        send->waitSend();
        recv->recv(1, slot);
        recv->waitRecv();
      } else {
        recv->recv(0, slot);
        recv->waitRecv();
        send->send(0, slot);
        send->waitSend();
      }
      break;
    }
    case BenchOp::kAlltoall: {
      ::gloo::AlltoallOptions o(m.context);
      o.setInput(as(in), n * es * m.world);
      o.setOutput(as(out), n * es * m.world);
      o.setTag(tag);
      ::gloo::alltoall(o);
      break;
    }
    case BenchOp::kGather: {
      ::gloo::GatherOptions o(m.context);
      o.setInput(as(in), n * es);
      if (m.rank == m.config.root) o.setOutput(as(out), n * es * m.world);
      o.setRoot(m.config.root);
      o.setTag(tag);
      ::gloo::gather(o);
      break;
    }
    case BenchOp::kScatter: {
      ::gloo::ScatterOptions o(m.context);
      std::vector<uint8_t*> blocks;
      for (int r = 0; r < m.world; ++r) blocks.push_back(as(in) + static_cast<size_t>(r) * n * es);
      if (m.rank == m.config.root) o.setInputs(blocks, n * es);
      o.setOutput(as(out), n * es);
      o.setRoot(m.config.root);
      o.setTag(tag);
      ::gloo::scatter(o);
      break;
    }
    case BenchOp::kReduceScatter:
      throw Error(ErrorCode::kUnavailable, "--baseline: Gloo 0.5 has no reduce_scatter function");
  }
}

}  // namespace tutti::bench
