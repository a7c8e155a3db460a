// The shm backend's single-copy collectives on symmetric memory (shm_symmetric.h): where every
// rank's memory for an op lies in memory every rank maps, each rank reads the others' straight
// from theirs, and a reduction writes its slice straight into the others', instead of every
// byte going through the segment's staging halves.
#include <algorithm>
#include <cstring>

#include "shm_internal.h"
#include "tensor/reduction.h"
#include "util/logging.h"

namespace tutti::shm_backend {

bool ShmBackend::announce_symmetric(Op& op, const void* p, size_t bytes) {
  const SymmetricPlace place = symmetric_->find(p, bytes);
  if (place.region == 0) return false;
  sym_[rank_].region[op.parity].store(place.region, std::memory_order_relaxed);
  sym_[rank_].offset[op.parity].store(place.offset, std::memory_order_relaxed);
  slots_[rank_].tag[op.parity].store(op.ctx.tag ^ kSymmetricTag);
  op.announced = true;
  return true;
}

bool ShmBackend::every_rank_symmetric(Op& op, const void* p, size_t bytes, bool eligible) {
  if (!eligible || !announce_symmetric(op, p, bytes)) return false;
  sync(op);
  return op.symmetric == world_size_;
}

void ShmBackend::meet_late_publishers(Op& op) {
  if (op.symmetric > 0 && !op.announced) sync(op);
}

bool ShmBackend::announced(const Op& op, int q) const {
  return slots_[q].tag[op.parity].load() != op.ctx.tag;  // after the check: the flag
}

char* ShmBackend::symmetric_of(const Op& op, int q, size_t bytes, const char* what) const {
  const uint64_t region = sym_[q].region[op.parity].load(std::memory_order_relaxed);
  const uint64_t offset = sym_[q].offset[op.parity].load(std::memory_order_relaxed);
  char* p = symmetric_->peer(q, region, offset, bytes);
  if (p == nullptr) {
    throw Error(ErrorCode::kRemoteError,
                op.ctx.description() + ": rank " + std::to_string(q) + " has its " + what +
                    " in symmetric region " + std::to_string(region) + " at offset " +
                    std::to_string(offset) + ", which rank " + std::to_string(rank_) +
                    " has not mapped for " + std::to_string(bytes) + " bytes");
  }
  TUTTI_LOG_DEBUG("shm: {} #{} of rank {}: single copy, rank {}'s {} in symmetric memory",
                  to_string(op.ctx.signature.op), op.seq, rank_, q, what);
  return p;
}

// Rank q reduces slice q of each chunk from every rank's tensor, block by block, in rank order
// from its own (as the staged path does: the bits are the same), and writes it into every rank's
// tensor (allreduce, root < 0) or the root's; a block bound for another rank goes out while in
// L1.
void ShmBackend::reduce_symmetric(const TensorView& t, ReduceOp reduce_op, int root, Op& op) {
  const detail::ReduceFn fn = detail::reduce_function(t.dtype(), reduce_op);
  const size_t es = t.element_size();
  const size_t n = static_cast<size_t>(t.numel());
  auto* data = static_cast<char*>(t.data());
  std::vector<const void*>& tensors = inputs_;  // by rank
  for (int q = 0; q < world_size_; ++q) {
    tensors[q] = q == rank_ ? data : symmetric_of(op, q, t.nbytes(), "tensor");
  }
  const size_t block = std::max<size_t>(1, detail::kReduceBlockBytes / es);
  if (root >= 0 && root != rank_ && block_out_.size() < block * es) block_out_.resize(block * es);
  const bool avg = reduce_op == ReduceOp::kAvg;
  // The staged path's chunks and slices, so that each element has the same owner (and so the
  // same order of its sum) either way.
  const size_t per_chunk = reduce_stride(es) * world_size_;
  for (size_t first = 0; first < n; first += per_chunk) {
    const size_t len = std::min(per_chunk, n - first);
    const size_t b = first + slice_begin(len, rank_);
    const size_t e = first + slice_begin(len, rank_ + 1);
    for (size_t s = b; s < e; s += block) {
      const size_t len_s = std::min(block, e - s);
      block_inputs_[0] = data + s * es;
      int k = 1;
      for (int q = 0; q < world_size_; ++q) {
        if (q != rank_) block_inputs_[k++] = static_cast<const char*>(tensors[q]) + s * es;
      }
      // A non-root of a reduce keeps its tensor: its slice is made aside, then sent to the root.
      char* out = root < 0 || root == rank_ ? data + s * es : block_out_.data();
      detail::reduce_many(fn, out, block_inputs_.data(), world_size_, len_s, es);
      if (avg) detail::scale_average(out, t.dtype(), len_s, world_size_);
      for (int q = 0; q < world_size_; ++q) {
        if (q == rank_ || (root >= 0 && q != root)) continue;
        std::memcpy(const_cast<char*>(static_cast<const char*>(tensors[q])) + s * es, out,
                    len_s * es);
      }
    }
  }
  sync(op);  // no rank returns while another still reads or writes its tensor
}

void ShmBackend::allgather_symmetric(const std::vector<TensorView>& out, const TensorView& in,
                                     Op& op) {
  const size_t total = in.nbytes();
  for (int q = 0; q < world_size_; ++q) {
    const char* from = q == rank_ ? static_cast<const char*>(in.data())
                                  : symmetric_of(op, q, total, "allgather input");
    if (out[q].data() != from) std::memcpy(out[q].data(), from, total);
  }
  sync(op);  // no rank writes its input again while another still reads it
}

// `in`: this rank's W blocks one after another; block q of every rank reduces into rank q's out.
void ShmBackend::reduce_scatter_symmetric(const TensorView& out, const TensorView& in,
                                          ReduceOp reduce_op, Op& op) {
  const detail::ReduceFn fn = detail::reduce_function(out.dtype(), reduce_op);
  const size_t es = out.element_size();
  const size_t n = static_cast<size_t>(out.numel());
  const size_t mine = out.nbytes() * static_cast<size_t>(rank_);  // our block in each input
  std::vector<const void*>& sources = inputs_;
  sources[0] = static_cast<const char*>(in.data()) + mine;
  int k = 1;
  for (int q = 0; q < world_size_; ++q) {
    if (q == rank_) continue;
    sources[k++] = symmetric_of(op, q, out.nbytes() * world_size_, "reduce_scatter input") + mine;
  }
  auto* dst = static_cast<char*>(out.data());
  const size_t block = std::max<size_t>(1, detail::kReduceBlockBytes / es);
  for (size_t s = 0; s < n; s += block) {
    const size_t len = std::min(block, n - s);
    for (int q = 0; q < world_size_; ++q) {
      block_inputs_[q] = static_cast<const char*>(sources[q]) + s * es;
    }
    detail::reduce_many(fn, dst + s * es, block_inputs_.data(), world_size_, len, es);
    if (reduce_op == ReduceOp::kAvg) {
      detail::scale_average(dst + s * es, out.dtype(), len, world_size_);
    }
  }
  sync(op);  // no rank writes its input again while another still reads it
}

}  // namespace tutti::shm_backend
