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

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "gloo_store.h"
#include "gloo_util.h"
#include "tensor/reduction.h"
#include "tutti/error.h"
#include "util/logging.h"

namespace tutti::gloo_backend {
namespace {

using Clock = std::chrono::steady_clock;

// Slot prefixes of tutti's own algorithms; Gloo's functions use 0x01..0x0b.
constexpr uint8_t kSendRecvSlotPrefix = 0xe1;
constexpr uint8_t kReduceScatterSlotPrefix = 0xe2;

std::string everyone(int world_size) {
  return "the other " + std::to_string(world_size - 1) + " rank(s) of the group";
}

detail::ReduceFn checked_reduce_function(DType dtype, ReduceOp op) {
  const detail::ReduceFn fn = detail::reduce_function(dtype, op);
  if (fn == nullptr) {
    throw Error(ErrorCode::kInternal,
                std::string("gloo: no reduction for ") + to_string(dtype) + " " + to_string(op));
  }
  return fn;
}

::gloo::AllreduceOptions::Func gloo_reduce_fn(DType dtype, ReduceOp op) {
  const detail::ReduceFn fn = checked_reduce_function(dtype, op);
  return [fn](void* out, const void* a, const void* b, size_t n) { fn(out, a, b, n); };
}

// A write to a peer that died raises SIGPIPE, whose default action ends the process: ignore it
// (the write then fails with EPIPE and Gloo reports the peer), unless the program handles it.
void ignore_sigpipe() {
  struct sigaction current;
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// Gloo adds its timeouts to its own clock: keep them far from the limits.
std::chrono::milliseconds capped(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(1);
  // Gloo adds its waits to its own clock: keep them far from the limits.
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::min<Clock::duration>(left, std::chrono::hours(24 * 365)));
}

// A byte count from the environment; none when unset or empty. kInvalidArgument naming the
// variable and its value when it is not a number.
std::optional<size_t> env_bytes(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0') {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(name) + " must be a byte count, not '" + v + "'");
  }
  return static_cast<size_t>(n);
}

// Where the small-message algorithm (the direct exchange, or recursive doubling at 4, 8, 16...
// ranks) stops beating the ring (tutti's, over the same sockets). Measured on loopback,
// 2026-12-01, with the 128 KiB local send buffers (docs/PERFORMANCE.md): at 2 ranks the direct
// exchange ahead up to 32 KiB and even with the ring from 64 KiB to 256 KiB, so 128 KiB (between
// two namespace hosts 256 KiB took 260-310 us against 50-65 us at 128 KiB); at 4 ranks doubling
// 1.3-2x ahead of the direct exchange at every size and of the ring up to 128 KiB, the ring ahead
// at 512 KiB; at 3 ranks the direct exchange even with the ring at 32 KiB. Elsewhere a guess, kept
// smaller as the small algorithms' traffic grows with the ranks (n - 1 or log2 n times the data
// per rank, against the ring's 2).
size_t direct_default(int world_size) {
  if (world_size == 2) return size_t{128} << 10;
  if (world_size == 4) return size_t{128} << 10;
  if (is_power_of_two(world_size)) return size_t{64} << 10;
  if (world_size == 3) return size_t{32} << 10;
  return size_t{8} << 10;
}

// The largest allreduce the small-message algorithm carries when the choice is automatic:
// TUTTI_GLOO_DIRECT_BYTES (0: none, the ring takes every size), else what was measured for this
// many ranks.
size_t direct_limit(int world_size) {
  return env_bytes("TUTTI_GLOO_DIRECT_BYTES").value_or(direct_default(world_size));
}

// TUTTI_GLOO_ALLREDUCE: auto (by size), direct, doubling, ring, or gloo (Gloo's own functions
// for allreduce and barrier, and no second context).
GlooAllreduce allreduce_choice() {
  const char* v = std::getenv("TUTTI_GLOO_ALLREDUCE");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "auto") return GlooAllreduce::kAuto;
  if (s == "direct") return GlooAllreduce::kDirect;
  if (s == "doubling") return GlooAllreduce::kDoubling;
  if (s == "ring") return GlooAllreduce::kRing;
  if (s == "gloo") return GlooAllreduce::kGloo;
  throw Error(ErrorCode::kInvalidArgument,
              "TUTTI_GLOO_ALLREDUCE must be auto, direct, doubling, ring or gloo, not '" + s + "'");
}

// The send buffer of the direct exchange's connection to each rank (0: the kernel's autotuning):
// TUTTI_GLOO_SNDBUF for every connection when set, else DirectExchange::kLocalSendBufferBytes to
// the ranks of this host and autotuning across hosts.
std::vector<size_t> send_buffer_sizes(const BackendContext& ctx) {
  if (const auto n = env_bytes("TUTTI_GLOO_SNDBUF")) return std::vector<size_t>(ctx.world_size, *n);
  std::vector<size_t> sizes(ctx.world_size, 0);
  const auto& hosts = ctx.hosts;
  for (int r = 0; r < ctx.world_size; ++r) {
    const bool known =
        static_cast<size_t>(r) < hosts.size() && static_cast<size_t>(ctx.rank) < hosts.size();
    if (known && hosts[r] == hosts[ctx.rank]) sizes[r] = DirectExchange::kLocalSendBufferBytes;
  }
  return sizes;
}

// What this rank's settings make allreduce choose, for comparing across ranks ("auto, the direct
// exchange up to 524288 bytes").
std::string allreduce_setting(GlooAllreduce choice, size_t limit) {
  switch (choice) {
    case GlooAllreduce::kAuto:
      return "auto, the direct exchange or doubling up to " + std::to_string(limit) + " bytes";
    case GlooAllreduce::kDirect: return "direct";
    case GlooAllreduce::kDoubling: return "doubling";
    case GlooAllreduce::kRing: return "ring";
    case GlooAllreduce::kGloo: return "gloo";
  }
  return "?";
}

// Every rank must choose the same algorithm for the same call: rank 0 publishes its settings and
// the others compare theirs, before any connection is made.
void agree_on_settings(Store& store, int rank, const std::string& mine) {
  const std::string key = "gloo/allreduce-setting";
  if (rank == 0) {
    store.set(key, mine);
    return;
  }
  const std::string theirs = store.get(key);
  if (theirs != mine) {
    throw Error(ErrorCode::kInvalidArgument,
                "rank 0's Gloo allreduce setting is '" + theirs + "', this rank's '" + mine +
                    "': TUTTI_GLOO_ALLREDUCE and TUTTI_GLOO_DIRECT_BYTES must be the same on "
                    "every rank");
  }
}

// The direct exchange and the ring send up to (n - 1) messages per rank and keep a socket per
// peer busy in one loop: past this many ranks Gloo's functions are used.
constexpr int kMaxDirectRanks = 64;

}  // namespace

template <typename Fn>
void GlooBackend::guarded(const OpContext& ctx, const std::string& waiting_for, Fn&& fn) {
  if (aborted_.load()) throw_aborted(ctx);
  try {
    fn();
  } catch (const ::gloo::IoException& e) {
    if (aborted_.load()) throw_aborted(ctx);
    const std::string msg = e.what();
    int peer = connections_.rank_in(msg);
    if (peer < 0 && direct_) peer = direct_->rank_in(msg);
    const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : waiting_for;
    if (msg.find("Timed out") != std::string::npos || msg.find("timeout") != std::string::npos) {
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for " + who + " (gloo: " + msg + ")");
    }
    throw Error(ErrorCode::kIoError, ctx.description() +
                                         ": transport error while exchanging with " + who +
                                         " (gloo: " + msg + ")");
  } catch (const Error&) {
    // The direct exchange's own errors: an abort's reset is what ended them.
    if (aborted_.load()) throw_aborted(ctx);
    throw;
  } catch (const ::gloo::EnforceNotMet& e) {
    if (aborted_.load()) throw_aborted(ctx);
    throw Error(ErrorCode::kInternal, ctx.description() + ": gloo check failed: " + e.what());
  } catch (const ::gloo::Exception& e) {
    if (aborted_.load()) throw_aborted(ctx);
    throw Error(ErrorCode::kInternal, ctx.description() + ": gloo: " + e.what());
  }
}

void GlooBackend::throw_aborted(const OpContext& ctx) const {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  throw Error(ErrorCode::kAborted, ctx.description() + ": aborted: " + reason_);
}

GlooBackend::GlooBackend(const BackendContext& ctx) : rank_(ctx.rank), world_size_(ctx.world_size) {
  if (world_size_ == 1) return;  // every op is local: no device, no threads
  direct_limit_ = direct_limit(world_size_);
  algorithm_ = allreduce_choice();
  // Every setting is read before anything connects: a bad one fails every rank alike, at once.
  const std::vector<size_t> send_buffers = send_buffer_sizes(ctx);
  const size_t keep = env_bytes("TUTTI_GLOO_KEEP_BYTES").value_or(DirectExchange::kKeptInboxBytes);
  agree_on_settings(*ctx.store, rank_, allreduce_setting(algorithm_, direct_limit_));
  // After the comparison, so that every rank fails alike (ranks that disagree fail on that).
  if (algorithm_ == GlooAllreduce::kDoubling && !is_power_of_two(world_size_)) {
    throw Error(ErrorCode::kInvalidArgument,
                "TUTTI_GLOO_ALLREDUCE=doubling needs a power of two ranks, not " +
                    std::to_string(world_size_));
  }
  ignore_sigpipe();
  try {
    device_ = ::gloo::transport::tcp::CreateDevice(device_attr());
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank_, world_size_);
    context->setTimeout(capped(ctx.timeout));
    GlooStore store(ctx.store, [this](int r, const std::vector<char>& addresses) {
      connections_.record(r, addresses);
    });
    context->connectFullMesh(store, device_);
    context_ = std::move(context);
    connections_.find(rank_, world_size_);
    if (algorithm_ != GlooAllreduce::kGloo && world_size_ <= kMaxDirectRanks) {
      direct_ = std::make_unique<DirectExchange>(rank_, world_size_, ctx.store, device_,
                                                 capped(ctx.timeout), send_buffers);
      direct_->keep_inboxes_up_to(keep);
    }
  } catch (const ::gloo::IoException& e) {
    const std::string msg = e.what();
    const ErrorCode code =
        msg.find("Timed out") != std::string::npos ? ErrorCode::kTimeout : ErrorCode::kIoError;
    throw Error(code, "connecting to the other ranks failed (gloo: " + msg + ")");
  } catch (const ::gloo::EnforceNotMet& e) {
    throw Error(ErrorCode::kIoError,
                std::string("connecting to the other ranks failed (gloo: ") + e.what() + ")");
  } catch (const ::gloo::Exception& e) {
    throw Error(ErrorCode::kIoError,
                std::string("connecting to the other ranks failed (gloo: ") + e.what() + ")");
  }
}

GlooBackend::~GlooBackend() {
  // The contexts' pairs go first, then the device and its event loop thread.
  direct_.reset();
  context_.reset();
  device_.reset();
}

void GlooBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (reason_.empty()) reason_ = reason;
    aborted_.store(true);
    for (auto* buffer : waiting_) {
      buffer->abortWaitSend();
      buffer->abortWaitRecv();
    }
  }
  connections_.reset_all();
  if (direct_) direct_->reset();
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

void GlooBackend::wait_buffer(::gloo::transport::UnboundBuffer& buffer, bool sending, int peer,
                              Clock::time_point deadline, const OpContext& ctx) {
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_.load()) {
      buffer.abortWaitSend();
      buffer.abortWaitRecv();
    }
    waiting_.insert(&buffer);
  }
  bool done = false;
  try {
    done = sending ? buffer.waitSend(left_until(deadline)) : buffer.waitRecv(left_until(deadline));
  } catch (...) {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    waiting_.erase(&buffer);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    waiting_.erase(&buffer);
  }
  if (!done) {
    if (aborted_.load()) throw_aborted(ctx);
    throw Error(ErrorCode::kInternal, ctx.description() + ": gloo ended a wait for rank " +
                                          std::to_string(peer) + " early");
  }
}

Backend::WorkPtr GlooBackend::allreduce(const std::vector<TensorView>& tensors,
                                        const AllreduceOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  if (direct_) {
    const detail::ReduceFn fn = checked_reduce_function(t.dtype(), opts.reduce_op);
    GlooAllreduce algorithm = algorithm_;
    if (algorithm == GlooAllreduce::kAuto) {
      // Small: one step to every peer, or log2(n) steps to one peer each at 4, 8, ... ranks.
      algorithm = t.nbytes() > direct_limit_                         ? GlooAllreduce::kRing
                  : is_power_of_two(world_size_) && world_size_ >= 4 ? GlooAllreduce::kDoubling
                                                                     : GlooAllreduce::kDirect;
    }
    guarded(ctx, everyone(world_size_), [&] {
      if (algorithm == GlooAllreduce::kDirect) {
        direct_->allreduce_direct(t.data(), t.nbytes(), t.element_size(), fn, ctx);
      } else if (algorithm == GlooAllreduce::kDoubling) {
        direct_->allreduce_doubling(t.data(), t.nbytes(), t.element_size(), fn, ctx);
      } else {
        direct_->allreduce_ring(t.data(), t.nbytes(), t.element_size(), fn, ctx);
      }
    });
  } else if (world_size_ > 1) {
    guarded(ctx, everyone(world_size_), [&] {
      ::gloo::AllreduceOptions o(context_);
      with_word(t.element_size(), [&](auto word) {
        using W = decltype(word);
        o.setOutput<W>(static_cast<W*>(t.data()), static_cast<size_t>(t.numel()));
      });
      o.setReduceFunction(gloo_reduce_fn(t.dtype(), opts.reduce_op));
      o.setTag(ctx.tag);
      o.setTimeout(capped(ctx.timeout));
      ::gloo::allreduce(o);
    });
  }
  if (opts.reduce_op == ReduceOp::kAvg) {
    detail::scale_average(t.data(), t.dtype(), static_cast<size_t>(t.numel()), world_size_);
  }
  return nullptr;
}

Backend::WorkPtr GlooBackend::reduce(const std::vector<TensorView>& tensors,
                                     const ReduceOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  const bool root = rank_ == opts.root_rank;
  if (direct_) {
    const detail::ReduceFn fn = checked_reduce_function(t.dtype(), opts.reduce_op);
    guarded(ctx, everyone(world_size_), [&] {
      direct_->reduce(t.data(), t.nbytes(), t.element_size(), fn, opts.root_rank,
                      /*by_ring=*/t.nbytes() > direct_limit_, ctx);
    });
  } else if (world_size_ > 1) {
    guarded(ctx, everyone(world_size_), [&] {
      ::gloo::ReduceOptions o(context_);
      with_word(t.element_size(), [&](auto word) {
        using W = decltype(word);
        const size_t n = static_cast<size_t>(t.numel());
        o.setInput<W>(static_cast<W*>(t.data()), n);
        // Gloo writes every rank's output: only the root's may be the caller's tensor.
        o.setOutput<W>(
            root ? static_cast<W*>(t.data()) : reinterpret_cast<W*>(scratch(0, t.nbytes())), n);
      });
      o.setRoot(opts.root_rank);
      o.setReduceFunction(gloo_reduce_fn(t.dtype(), opts.reduce_op));
      o.setTag(ctx.tag);
      o.setTimeout(capped(ctx.timeout));
      ::gloo::reduce(o);
    });
  }
  if (root && opts.reduce_op == ReduceOp::kAvg) {
    detail::scale_average(t.data(), t.dtype(), static_cast<size_t>(t.numel()), world_size_);
  }
  return nullptr;
}

Backend::WorkPtr GlooBackend::broadcast(const std::vector<TensorView>& tensors,
                                        const BroadcastOptions& opts, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;
  const TensorView& t = tensors[0];
  if (direct_) {
    // Small: the root sends to each rank; large: down the chain of ranks from the root.
    const bool chain = t.nbytes() > direct_limit_;
    // (The direct exchange names the ranks it waits for itself.)
    guarded(ctx, everyone(world_size_),
            [&] { direct_->broadcast(t.data(), t.nbytes(), opts.root_rank, chain, ctx); });
    return nullptr;
  }
  guarded(ctx,
          rank_ == opts.root_rank ? everyone(world_size_)
                                  : "root rank " + std::to_string(opts.root_rank),
          [&] {
            ::gloo::BroadcastOptions o(context_);
            with_word(t.element_size(), [&](auto word) {
              using W = decltype(word);
              o.setOutput<W>(static_cast<W*>(t.data()), static_cast<size_t>(t.numel()));
            });
            o.setRoot(opts.root_rank);
            o.setTag(ctx.tag);
            o.setTimeout(capped(ctx.timeout));
            ::gloo::broadcast(o);
          });
  return nullptr;
}

// Gathers every rank's input into `output` (world_size blocks back to back); in place when the
// input already is this rank's block.
void GlooBackend::allgather_buffer(char* output, const TensorView& input, bool in_place,
                                   const OpContext& ctx) {
  if (direct_) {
    const void* mine = in_place ? output + rank_ * input.nbytes() : input.data();
    guarded(ctx, everyone(world_size_),
            [&] { direct_->allgather(mine, input.nbytes(), output, ctx); });
    return;
  }
  guarded(ctx, everyone(world_size_), [&] {
    ::gloo::AllgatherOptions o(context_);
    with_word(input.element_size(), [&](auto word) {
      using W = decltype(word);
      const size_t n = static_cast<size_t>(input.numel());
      if (!in_place) o.setInput<W>(static_cast<W*>(input.data()), n);
      o.setOutput<W>(reinterpret_cast<W*>(output), n * static_cast<size_t>(world_size_));
    });
    o.setTag(ctx.tag);
    o.setTimeout(capped(ctx.timeout));
    ::gloo::allgather(o);
  });
}

Backend::WorkPtr GlooBackend::allgather_into(const TensorView& output, const TensorView& input,
                                             const AllgatherOptions&, const OpContext& ctx) {
  auto* out = static_cast<char*>(output.data());
  const size_t bytes = input.nbytes();
  const bool in_place = out + rank_ * bytes == static_cast<char*>(input.data());
  if (world_size_ == 1) {
    if (!in_place) std::memcpy(out, input.data(), bytes);
    return nullptr;
  }
  allgather_buffer(out, input, in_place, ctx);
  return nullptr;
}

Backend::WorkPtr GlooBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                                        const std::vector<TensorView>& inputs,
                                        const AllgatherOptions&, const OpContext& ctx) {
  const TensorView& in = inputs[0];
  const std::vector<TensorView>& out = outputs[0];
  const size_t bytes = in.nbytes();
  if (world_size_ == 1) {
    if (out[0].data() != in.data()) std::memcpy(out[0].data(), in.data(), bytes);
    return nullptr;
  }
  // Separate buffers: gather into scratch, then copy each block out.
  char* gathered = scratch(0, bytes * world_size_);
  allgather_buffer(gathered, in, /*in_place=*/false, ctx);
  for (int r = 0; r < world_size_; ++r) std::memcpy(out[r].data(), gathered + r * bytes, bytes);
  return nullptr;
}

Backend::WorkPtr GlooBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                             const std::vector<std::vector<TensorView>>& inputs,
                                             const ReduceScatterOptions& opts,
                                             const OpContext& ctx) {
  const TensorView& out = outputs[0];
  const std::vector<TensorView>& in = inputs[0];
  const size_t bytes = out.nbytes();
  const size_t n = static_cast<size_t>(out.numel());
  const int w = world_size_;
  if (w == 1) {
    if (out.data() != in[0].data()) std::memcpy(out.data(), in[0].data(), bytes);
  } else if (direct_) {
    const detail::ReduceFn fn = checked_reduce_function(out.dtype(), opts.reduce_op);
    std::vector<const void*> blocks(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) blocks[r] = in[r].data();
    guarded(ctx, everyone(w), [&] {
      direct_->reduce_scatter(blocks, out.data(), bytes, out.element_size(), fn, ctx);
    });
  } else {
    // A ring: at step s this rank sends its running sum of block (rank - s - 1) to the right
    // and receives the left neighbour's running sum of block (rank - s - 2), adding its own
    // input. After w - 1 steps the block received is its own, fully reduced, written straight
    // into the output. Two accumulators alternate so the one being sent is never overwritten.
    const detail::ReduceFn fn = checked_reduce_function(out.dtype(), opts.reduce_op);
    char* incoming = scratch(0, bytes);
    char* acc[2] = {scratch(1, bytes), scratch(2, bytes)};
    const int right = (rank_ + 1) % w;
    const int left = (rank_ - 1 + w) % w;
    const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, ctx.tag);
    const auto deadline = ctx.deadline();
    // Gloo's timeouts carry no address: the neighbour of the wait in progress names it.
    const std::string from_left = "rank " + std::to_string(left) + " (ring neighbour, its block)";
    const std::string to_right =
        "rank " + std::to_string(right) + " (ring neighbour, to take this rank's block)";
    std::string waiting_for = from_left;
    guarded(ctx, waiting_for, [&] {
      auto recv_buf = context_->createUnboundBuffer(incoming, bytes);
      const void* sending = in[(rank_ - 1 + w) % w].data();
      for (int s = 0; s < w - 1; ++s) {
        auto send_buf = context_->createUnboundBuffer(const_cast<void*>(sending), bytes);
        send_buf->send(right, slot);
        recv_buf->recv(left, slot);
        waiting_for = from_left;
        wait_buffer(*recv_buf, /*sending=*/false, left, deadline, ctx);
        waiting_for = to_right;
        wait_buffer(*send_buf, /*sending=*/true, right, deadline, ctx);
        const int block = ((rank_ - s - 2) % w + w) % w;
        char* target = (s == w - 2) ? static_cast<char*>(out.data()) : acc[s % 2];
        fn(target, in[block].data(), incoming, n);
        sending = target;
      }
    });
  }
  if (opts.reduce_op == ReduceOp::kAvg) detail::scale_average(out.data(), out.dtype(), n, w);
  return nullptr;
}

Backend::WorkPtr GlooBackend::barrier(const BarrierOptions&, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;
  if (direct_) {
    guarded(ctx, everyone(world_size_), [&] { direct_->barrier(ctx); });
    return nullptr;
  }
  guarded(ctx, everyone(world_size_), [&] {
    ::gloo::BarrierOptions o(context_);
    o.setTag(ctx.tag);
    o.setTimeout(capped(ctx.timeout));
    ::gloo::barrier(o);
  });
  return nullptr;
}

Backend::WorkPtr GlooBackend::send(const std::vector<TensorView>& tensors, int dst_rank,
                                   const SendOptions&, const OpContext& ctx) {
  P2PRequest r;
  r.kind = P2POp::Kind::kSend;
  r.tensor = tensors[0];
  r.peer = dst_rank;
  r.seq = ctx.seq;
  r.tag = ctx.tag;
  return batch_p2p({r}, BatchP2POptions{}, ctx);
}

Backend::WorkPtr GlooBackend::recv(const std::vector<TensorView>& tensors, int src_rank,
                                   const RecvOptions&, const OpContext& ctx) {
  P2PRequest r;
  r.kind = P2POp::Kind::kRecv;
  r.tensor = tensors[0];
  r.peer = src_rank;
  r.seq = ctx.seq;
  r.tag = ctx.tag;
  return batch_p2p({r}, BatchP2POptions{}, ctx);
}

// Every message is posted before any is waited for: the direct exchange moves them all at once
// over its sockets (each peer's in order, per direction), or Gloo's pairs do.
Backend::WorkPtr GlooBackend::batch_p2p(const std::vector<P2PRequest>& requests,
                                        const BatchP2POptions&, const OpContext& ctx) {
  if (world_size_ == 1 || requests.empty()) return nullptr;
  const auto deadline = ctx.deadline();
  std::string peers;
  for (const auto& r : requests) {
    peers += (peers.empty() ? "rank " : ", rank ") + std::to_string(r.peer) +
             (r.kind == P2POp::Kind::kSend ? " to receive" : " to send");
  }
  if (direct_) {
    std::vector<DirectExchange::Message> messages(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const P2PRequest& r = requests[i];
      messages[i].send = r.kind == P2POp::Kind::kSend;
      messages[i].peer = r.peer;
      messages[i].data = r.tensor.data();
      messages[i].bytes = r.tensor.nbytes();
      messages[i].tag = r.tag;
    }
    guarded(ctx, peers, [&] { direct_->p2p(messages, ctx); });
    return nullptr;
  }
  guarded(ctx, peers, [&] {
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> buffers;
    buffers.reserve(requests.size());
    for (const auto& r : requests) {
      buffers.push_back(context_->createUnboundBuffer(r.tensor.data(), r.tensor.nbytes()));
      const auto slot = ::gloo::Slot::build(kSendRecvSlotPrefix, r.tag);
      if (r.kind == P2POp::Kind::kSend) {
        buffers.back()->send(r.peer, slot);
      } else {
        buffers.back()->recv(r.peer, slot);
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      wait_buffer(*buffers[i], requests[i].kind == P2POp::Kind::kSend, requests[i].peer, deadline,
                  ctx);
    }
  });
  return nullptr;
}

}  // namespace tutti::gloo_backend
