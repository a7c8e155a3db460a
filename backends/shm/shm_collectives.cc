// The shm backend's collectives: small messages through each rank's published slot, large
// ones chunk by chunk through the staging halves, reductions split across ranks.
#include <algorithm>
#include <cstring>

#include "shm_internal.h"
#include "tensor/reduction.h"
#include "util/logging.h"

namespace tutti::shm_backend {
namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

Backend::WorkPtr ShmBackend::barrier(const BarrierOptions&, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;
  Op op = begin_op(ctx);
  exchange(op, nullptr, 0, 0);
  end_op(op);
  return nullptr;
}

Backend::WorkPtr ShmBackend::broadcast(const std::vector<TensorView>& tensors,
                                       const BroadcastOptions& opts, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;
  const TensorView& t = tensors[0];
  Op op = begin_op(ctx);
  auto* data = static_cast<char*>(t.data());
  const size_t total = t.nbytes();
  // Up to 8 KiB the one-step path (the root copies its tensor into its slot, the others read it
  // there); larger ones staged, where the root's way is timed (its readers' copies included):
  // the one-step path's stores are ordinary ones, and a 16 KiB broadcast took 7.8 us by it with
  // the CPUs far apart against 1.9 staged (near 2.2 against 1.8; AMD EPYC VM, 2026-12-07).
  constexpr size_t kSmallBroadcastBytes = size_t{8} << 10;
  if (total <= kSmallBroadcastBytes) {
    const bool root = rank_ == opts.root_rank;
    exchange(op, root ? data : nullptr, root ? total : 0, root ? 0 : total, opts.root_rank);
    if (!root) std::memcpy(data, small_payload(opts.root_rank, op.parity, total), total);
  } else if (total > kSmallBytes && rank_ == opts.root_rank &&
             announce_symmetric(op, data, total)) {
    // The root's tensor is in symmetric memory: the others copy it from there (between these
    // two barriers: the root returns, and may write it, only once they have).
    sync(op);
    sync(op);
  } else {
    const int root = opts.root_rank;
    // The root's way alone: only the root publishes (and picks, on the staged path only).
    const PublishChooser::Pick how =
        rank_ == root ? publish_.pick(PublishChooser::kBroadcast, total) : PublishChooser::Pick{};
    // Its waits count: they are the others' copies of what it stored (shm_publish.h). A timed
    // op ends with one more barrier, after the last chunk's copies (a one-chunk broadcast's
    // readers copy after its last barrier otherwise, and no time held their reads): the root
    // says beside its tag whether it times the op, and the others read it after the first.
    if (rank_ == root) {
      sym_[rank_].timed_broadcast[op.parity].store(how.timed ? op.seq : ~op.seq,
                                                   std::memory_order_relaxed);
    }
    bool timed = how.timed;
    PublishTimer timer(how);
    for (size_t off = 0; off < total; off += chunk_) {
      const size_t len = std::min(chunk_, total - off);
      const int half = static_cast<int>(flips_ & 1);
      if (rank_ == root) publish(how, stage(rank_, half), data + off, len);
      timer.published();
      sync(op);
      if (off == 0 && announced(op, root)) {
        std::memcpy(data, symmetric_of(op, root, total, "broadcast"), total);
        sync(op);
        break;
      }
      if (off == 0 && rank_ != root) {
        timed = sym_[root].timed_broadcast[op.parity].load(std::memory_order_relaxed) == op.seq;
      }
      timer.met();
      ++flips_;
      if (rank_ != root) std::memcpy(data + off, stage(root, half), len);
    }
    if (timed) sync(op);  // (never after the symmetric path's break: no rank there times it)
    published(PublishChooser::kBroadcast, total, how, timer);
  }
  end_op(op);
  return nullptr;
}

Backend::WorkPtr ShmBackend::allreduce(const std::vector<TensorView>& tensors,
                                       const AllreduceOptions& opts, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;  // the sum (or avg) of one rank is its own tensor
  Op op = begin_op(ctx);
  reduce_chunks(tensors[0], opts.reduce_op, -1, op);
  end_op(op);
  return nullptr;
}

Backend::WorkPtr ShmBackend::reduce(const std::vector<TensorView>& tensors,
                                    const ReduceOptions& opts, const OpContext& ctx) {
  if (world_size_ == 1) return nullptr;
  Op op = begin_op(ctx);
  reduce_chunks(tensors[0], opts.reduce_op, opts.root_rank, op);
  end_op(op);
  return nullptr;
}

// allreduce (root < 0) or reduce to root, in place on t.
void ShmBackend::reduce_chunks(const TensorView& t, ReduceOp reduce_op, int root, Op& op) {
  const detail::ReduceFn fn = detail::reduce_function(t.dtype(), reduce_op);
  const size_t es = t.element_size();
  auto* data = static_cast<char*>(t.data());
  const size_t n = static_cast<size_t>(t.numel());
  const bool avg = reduce_op == ReduceOp::kAvg;
  const bool to_me = root < 0 || root == rank_;
  std::vector<const void*>& inputs = inputs_;

  if (t.nbytes() <= kSmallBytes) {
    // One step: everyone publishes, then each receiver folds the whole message from the
    // published copies in rank order (so every rank computes the same bits).
    // An allreduce's way is chosen by timing it; a reduce's stays ordinary stores: what its
    // non-roots' stores cost is the root's reads, which no non-root's time holds.
    const PublishChooser::Pick how =
        root < 0 ? pick_small(PublishChooser::kSmallReduce, t.nbytes()) : PublishChooser::Pick{};
    PublishTimer timer(how);
    exchange(op, data, t.nbytes(), to_me ? t.nbytes() : 0, -1, how, how.timed ? &timer : nullptr);
    if (!to_me) return;
    for (int q = 0; q < world_size_; ++q) inputs[q] = small_payload(q, op.parity, t.nbytes());
    // Our own values from our tensor (in place, still our input), not from our published copy:
    // the peers reading that line have just taken it from this core (reading it back cost ~65
    // ns of the 8-byte allreduce's ~550). The same values, so the same bits on every rank; where
    // reduce_many lets the output alias an input (the first two).
    if (rank_ <= 1) inputs[rank_] = data;
    detail::reduce_many(fn, data, inputs.data(), world_size_, n, es);
    if (avg) detail::scale_average(data, t.dtype(), n, world_size_);
    if (how.timed) published(PublishChooser::kSmallReduce, t.nbytes(), how, timer);
    return;
  }

  // A tensor in symmetric memory on every rank: the single-copy path (the first barrier's tag
  // check counts them). Otherwise the staged path, whose first chunk meets the ranks that
  // announced once more (they published it only after that barrier).
  if (every_rank_symmetric(op, data, t.nbytes())) return reduce_symmetric(t, reduce_op, root, op);

  // Chunks of `per_chunk` elements (W slices of `stride`; the last chunk's slices are shorter):
  // within a chunk rank q reduces slice q from every rank and publishes it, then the others copy
  // it out. One barrier per chunk: the next chunk's inputs go into the other staging half before
  // the barrier that also says this chunk's slices are reduced (and one barrier first). Slice q
  // has the same place in every chunk's half (q x stride), so a rank that writes the inputs of
  // chunk i + 2 while a slower one still copies chunk i's reduced slices out of that half never
  // writes where that one reads: the inputs go to the others' slices, the reduced one is the
  // writer's own, which it writes again only after the next barrier.
  const size_t stride = reduce_stride(es);
  const size_t per_chunk = stride * world_size_;
  auto slot = [&](int r, int half, int q) { return stage(r, half) + q * stride * es; };
  const PublishChooser::Pick how = publish_.pick(PublishChooser::kReduce, t.nbytes());
  // Publish what the others reduce: every slice of the chunk but our own.
  auto publish_inputs = [&](size_t first, size_t len, int half) {
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      const size_t b = slice_begin(len, q), e = slice_begin(len, q + 1);
      publish(how, slot(rank_, half, q), data + (first + b) * es, (e - b) * es);
    }
  };
  const size_t block = std::max<size_t>(1, detail::kReduceBlockBytes / es);
  // A reduce's non-root reduces its slice into the staging area; streamed, through a block of
  // its own first.
  if (!to_me && how.stream && block_out_.size() < block * es) block_out_.resize(block * es);
  PublishTimer timer(how, op.timer);
  size_t first = 0;
  size_t len = std::min(per_chunk, n);
  int half = static_cast<int>(flips_++ & 1);
  publish_inputs(first, len, half);
  timer.published();
  sync(op);
  meet_late_publishers(op);
  timer.met();
  while (true) {
    // Our slice: our own input first (the output, our tensor, may alias it; reduce_many allows
    // the first or the second input), then the others' in rank order. The result goes to our
    // staging area for the others, and to our tensor unless this is a reduce to another rank
    // (whose non-roots keep their tensors).
    const size_t b = slice_begin(len, rank_), e = slice_begin(len, rank_ + 1);
    if (e > b) {
      inputs[0] = data + (first + b) * es;
      int k = 1;
      for (int q = 0; q < world_size_; ++q) {
        if (q != rank_) inputs[k++] = slot(q, half, rank_);
      }
      // Block by block (reduce_many's own), each copied to the staging area while in L1.
      for (size_t s = 0; s < e - b; s += block) {
        const size_t len_s = std::min(block, e - b - s);
        for (int k = 0; k < world_size_; ++k) {
          block_inputs_[k] = static_cast<const char*>(inputs[k]) + s * es;
        }
        char* published = slot(rank_, half, rank_) + s * es;
        char* out = to_me        ? data + (first + b + s) * es
                    : how.stream ? block_out_.data()
                                 : published;
        detail::reduce_many(fn, out, block_inputs_.data(), world_size_, len_s, es);
        if (avg) detail::scale_average(out, t.dtype(), len_s, world_size_);
        // The others copy it out; a reduce's root alone needs its own slice, in its tensor.
        if (out != published && root != rank_) publish(how, published, out, len_s * es);
      }
    }
    const size_t next = first + len;
    const size_t next_len = std::min(per_chunk, n - next);
    const int next_half = next < n ? static_cast<int>(flips_++ & 1) : half;
    if (next < n) publish_inputs(next, next_len, next_half);
    sync(op);
    if (to_me) {
      for (int q = 0; q < world_size_; ++q) {
        if (q == rank_) continue;
        const size_t qb = slice_begin(len, q), qe = slice_begin(len, q + 1);
        std::memcpy(data + (first + qb) * es, slot(q, half, q), (qe - qb) * es);
      }
    }
    if (next >= n) break;
    first = next;
    len = next_len;
    half = next_half;
  }
  published(PublishChooser::kReduce, t.nbytes(), how, timer);
}

Backend::WorkPtr ShmBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                                       const std::vector<TensorView>& inputs,
                                       const AllgatherOptions&, const OpContext& ctx) {
  const TensorView& in = inputs[0];
  const std::vector<TensorView>& out = outputs[0];
  const auto* src = static_cast<const char*>(in.data());
  const size_t total = in.nbytes();
  if (world_size_ == 1) {
    if (out[0].data() != in.data()) std::memcpy(out[0].data(), src, total);
    return nullptr;
  }
  Op op = begin_op(ctx);
  if (total <= kSmallBytes) {
    const PublishChooser::Pick how = pick_small(PublishChooser::kSmallAllgather, total);
    PublishTimer timer(how);
    exchange(op, src, total, total, -1, how, how.timed ? &timer : nullptr);
    for (int q = 0; q < world_size_; ++q) {
      char* dst = static_cast<char*>(out[q].data());
      const char* from = q == rank_ ? src : small_payload(q, op.parity, total);
      if (dst != from) std::memcpy(dst, from, total);
    }
    if (how.timed) published(PublishChooser::kSmallAllgather, total, how, timer);
  } else {
    // Inputs in symmetric memory on every rank: each copies the others' straight from theirs;
    // not where an output would overwrite the input while the others read it (the list form
    // may be given such outputs; the staged path copies the input out first).
    bool apart = symmetric_->any();
    for (int q = 0; apart && q < world_size_; ++q) {
      apart = out[q].data() == src || !overlaps(out[q].data(), total, src, total);
    }
    if (every_rank_symmetric(op, src, total, apart)) {
      allgather_symmetric(out, in, op);
      end_op(op);
      return nullptr;
    }
    const PublishChooser::Pick how = publish_.pick(PublishChooser::kAllgather, total);
    PublishTimer timer(how, op.timer);
    for (size_t off = 0; off < total; off += chunk_) {
      const size_t len = std::min(chunk_, total - off);
      const int half = static_cast<int>(flips_++ & 1);
      publish(how, stage(rank_, half), src + off, len);
      timer.published();
      sync(op);
      if (off == 0) meet_late_publishers(op);
      timer.met();
      for (int q = 0; q < world_size_; ++q) {
        char* dst = static_cast<char*>(out[q].data()) + off;
        const char* from = q == rank_ ? src + off : stage(q, half);
        if (dst != from) std::memcpy(dst, from, len);
      }
    }
    published(PublishChooser::kAllgather, total, how, timer);
  }
  end_op(op);
  return nullptr;
}

Backend::WorkPtr ShmBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                            const std::vector<std::vector<TensorView>>& inputs,
                                            const ReduceScatterOptions& opts,
                                            const OpContext& ctx) {
  const TensorView& out = outputs[0];
  const std::vector<TensorView>& in = inputs[0];
  const size_t es = out.element_size();
  const size_t n = static_cast<size_t>(out.numel());
  if (world_size_ == 1) {
    if (out.data() != in[0].data()) std::memcpy(out.data(), in[0].data(), out.nbytes());
    return nullptr;
  }
  Op op = begin_op(ctx);
  // Every rank's blocks one after another in symmetric memory: each reduces its block straight
  // from the others' inputs; not where the output overlaps a block the others read (only our
  // own block may be the output).
  const size_t span = out.nbytes() * world_size_;
  bool contiguous = symmetric_->any();
  for (int q = 1; contiguous && q < world_size_; ++q) {
    contiguous = static_cast<const char*>(in[q].data()) ==
                 static_cast<const char*>(in[0].data()) + q * out.nbytes();
  }
  contiguous = contiguous && (out.data() == in[rank_].data() ||
                              !overlaps(out.data(), out.nbytes(), in[0].data(), span));
  if (every_rank_symmetric(op, in[0].data(), span, contiguous)) {
    reduce_scatter_symmetric(out, in[0], opts.reduce_op, op);
    end_op(op);
    return nullptr;
  }
  const detail::ReduceFn fn = detail::reduce_function(out.dtype(), opts.reduce_op);
  std::vector<const void*>& sources = inputs_;
  // Each chunk holds `len` elements of every block, so W x len must fit a staging half.
  const size_t per_chunk = reduce_stride(es);
  const PublishChooser::Pick how = publish_.pick(PublishChooser::kReduceScatter, out.nbytes());
  PublishTimer timer(how, op.timer);
  for (size_t first = 0; first < n; first += per_chunk) {
    const size_t len = std::min(per_chunk, n - first);
    const int half = static_cast<int>(flips_++ & 1);
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      publish(how, stage(rank_, half) + q * len * es,
              static_cast<const char*>(in[q].data()) + first * es, len * es);
    }
    timer.published();
    sync(op);
    if (first == 0) meet_late_publishers(op);
    timer.met();
    sources[0] = static_cast<const char*>(in[rank_].data()) + first * es;
    int k = 1;
    for (int q = 0; q < world_size_; ++q) {
      if (q != rank_) sources[k++] = stage(q, half) + rank_ * len * es;
    }
    char* dst = static_cast<char*>(out.data()) + first * es;
    detail::reduce_many(fn, dst, sources.data(), world_size_, len, es);
    if (opts.reduce_op == ReduceOp::kAvg) detail::scale_average(dst, out.dtype(), len, world_size_);
  }
  published(PublishChooser::kReduceScatter, out.nbytes(), how, timer);
  end_op(op);
  return nullptr;
}

}  // namespace tutti::shm_backend
