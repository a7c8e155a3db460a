#include "shm_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "group_util.h"
#include "host_identity.h"
#include "logging.h"
#include "reduction.h"
#include "shm_wait.h"
#include "tutti/error.h"
#include "tutti/store.h"

namespace tutti::shm_backend {

namespace {

// Messages up to this size reduce in one step: every rank folds the whole message from every
// rank's staging area (one barrier); larger ones split the work (two barriers per chunk).
constexpr size_t kSmallBytes = 16 * 1024;

// A number from the environment, or the fallback when unset or below `min_value`.
size_t env_size(const char* name, size_t fallback, size_t min_value = 4096) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (*end == '\0' && n >= min_value) ? static_cast<size_t>(n) : fallback;
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

[[noreturn]] void throw_errno(const std::string& what) {
  throw Error(ErrorCode::kIoError, "shm: " + what + ": " + std::strerror(errno));
}

}  // namespace

// The segment's layout. Every word another rank writes sits on its own cache line.
struct alignas(64) Line {
  std::atomic<uint32_t> value{0};
};

// The segment's barrier. (Ranks that disagree on its layout are caught by the size check at
// attach: the size follows from world size, chunk and mailbox bytes.)
struct alignas(64) Header {
  Line count;        // barrier: ranks arrived in the current generation
  Line generation;   // barrier: bumped by the last rank to arrive
  Line sleepers;     // barrier: ranks asleep on `generation`
};

struct alignas(64) RankSlot {
  std::atomic<uint32_t> arrived{0};  // the last barrier epoch this rank entered
  std::atomic<uint32_t> tag[2];      // the tag of its current collective, by op parity
};

// A rank's publication for small ops: seq says which op its payload (inline up to
// kInlineBytes, else in the kSmallBytes that follow the line) and tag belong to. Peers wait on
// seq; one cache line carries a tiny message.
struct alignas(64) SmallSlot {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
  uint32_t tag;
  uint32_t reserved;
  char inline_payload[48];
};
constexpr size_t kInlineBytes = sizeof(SmallSlot::inline_payload);
constexpr size_t kSmallSlotBytes = sizeof(SmallSlot) + kSmallBytes;

struct alignas(64) Channel {  // one sender -> one receiver
  Line sent;         // chunks written by the sender
  Line acked;        // chunks consumed by the receiver
  Line send_sleepers;
  Line recv_sleepers;
  uint64_t length[2];  // the whole message's byte count, per slot, for a size check
};

// One collective in flight.
struct ShmBackend::Op {
  const OpContext& ctx;
  Clock::time_point deadline;
  uint32_t seq;          // this backend's collective count, the same on every rank (from 1)
  uint32_t parity;       // seq & 1: which of two slots this op uses
  bool checked = false;  // the tags have been compared
};

ShmBackend::ShmBackend(const BackendContext& ctx) : rank_(ctx.rank), world_size_(ctx.world_size) {
  if (world_size_ == 1) return;  // every op is local
  inputs_.resize(static_cast<size_t>(world_size_));
  Store& store = *ctx.store;

  // Shared memory needs one host: compare every rank's host identity first.
  const std::string me = detail::host_identity();
  store.set("shm/host/" + std::to_string(rank_), me);
  for (int r = 0; r < world_size_; ++r) {
    const std::string other = store.get("shm/host/" + std::to_string(r));
    if (other != me) {
      throw Error(ErrorCode::kUnavailable,
                  "the shm backend needs every rank on one host: rank " + std::to_string(r) +
                      " runs on '" + other + "', rank " + std::to_string(rank_) + " on '" + me +
                      "' (use backend 'gloo', or 'auto' to choose)");
    }
  }

  chunk_ = align_up(env_size("TUTTI_SHM_CHUNK_BYTES", 1 << 20), 4096);
  mail_ = align_up(env_size("TUTTI_SHM_MAILBOX_BYTES", 256 << 10), 4096);
  const size_t w = static_cast<size_t>(world_size_);
  const size_t slots_off = align_up(sizeof(Header), 64);
  const size_t channels_off = slots_off + w * sizeof(RankSlot);
  const size_t small_off = align_up(channels_off + w * w * sizeof(Channel), 64);
  const size_t staging_off = align_up(small_off + w * 2 * kSmallSlotBytes, 4096);
  const size_t mail_off = staging_off + w * 2 * chunk_;
  size_ = mail_off + w * w * 2 * mail_;
  // Spinning helps only while every rank has a core (then a peer is < 1 us away); with more
  // ranks than cores, a spinning rank would hold up the very rank it waits for, so it yields.
  // Either way the wait ends asleep on a futex. TUTTI_SHM_SPINS overrides the spin count.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool oversubscribed = static_cast<unsigned>(world_size_) > cores;
  spin_.spins = static_cast<int>(env_size("TUTTI_SHM_SPINS", oversubscribed ? 0 : 2000, 0));
  spin_.yields = static_cast<int>(env_size("TUTTI_SHM_YIELDS", oversubscribed ? 200 : 50, 0));

  // The name carries the job's and group's identity (long ones shortened with a hash) and a
  // random suffix: two jobs without job ids, using one group name on one host, never collide.
  // The other ranks read the name from the store.
  std::string name = "/tutti-" + ctx.instance;
  if (name.size() > 200) {
    name = name.substr(0, 180) + "-" +
           std::to_string(detail::Fnv1a().mix(std::hash<std::string>()(ctx.instance)).value());
  }
  {
    std::random_device rd;
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "-%08x", rd());
    name += suffix;
  }
  int fd = -1;
  if (rank_ == 0) {
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw_errno("creating segment '" + name + "'");
    if (::ftruncate(fd, static_cast<off_t>(size_)) != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw_errno("sizing segment '" + name + "' to " + std::to_string(size_) + " bytes");
    }
    store.set("shm/segment", name);
  } else {
    const std::string published = store.get("shm/segment");
    fd = ::shm_open(published.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) throw_errno("opening segment '" + published + "' (is /dev/shm shared?)");
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size_) {
      ::close(fd);
      throw Error(ErrorCode::kRemoteError,
                  "shm: segment '" + published + "' has " + std::to_string(st.st_size) +
                      " bytes, this rank expects " + std::to_string(size_) +
                      " (ranks disagree on TUTTI_SHM_CHUNK_BYTES or TUTTI_SHM_MAILBOX_BYTES)");
    }
  }
  // Populated up front: first-touch faults (~12 us per 4 KiB page here) stay out of the ops.
  base_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (rank_ == 0) ::shm_unlink(name.c_str());
    throw_errno("mapping segment '" + name + "'");
  }
  header_ = static_cast<Header*>(base_);
  slots_ = reinterpret_cast<RankSlot*>(static_cast<char*>(base_) + slots_off);
  channels_ = reinterpret_cast<Channel*>(static_cast<char*>(base_) + channels_off);
  small_ = static_cast<char*>(base_) + small_off;
  staging_ = static_cast<char*>(base_) + staging_off;
  mailboxes_ = static_cast<char*>(base_) + mail_off;
  // Everyone attached: then the name goes, so nothing outlives the processes.
  store.set("shm/attached/" + std::to_string(rank_), "1");
  if (rank_ == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_size_; ++r) keys.push_back("shm/attached/" + std::to_string(r));
    try {
      store.wait(keys);
    } catch (...) {
      ::shm_unlink(name.c_str());
      throw;
    }
    ::shm_unlink(name.c_str());
  }
  TUTTI_LOG_DEBUG("shm: rank {}/{} attached '{}' ({} bytes)", rank_, world_size_, name, size_);
}

ShmBackend::~ShmBackend() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

char* ShmBackend::stage(int rank, int half) const {
  return staging_ + (static_cast<size_t>(rank) * 2 + static_cast<size_t>(half)) * chunk_;
}

char* ShmBackend::mailbox(int src, int dst, int slot) const {
  return mailboxes_ +
         ((static_cast<size_t>(src) * world_size_ + static_cast<size_t>(dst)) * 2 + slot) * mail_;
}

Channel& ShmBackend::channel(int src, int dst) const {
  return channels_[static_cast<size_t>(src) * world_size_ + static_cast<size_t>(dst)];
}

// A barrier over all ranks; after the op's first one, every rank's tag must equal ours.
void ShmBackend::sync(Op& op) {
  const uint32_t epoch = ++epoch_;
  slots_[rank_].arrived.store(epoch);
  const uint32_t generation = header_->generation.value.load();
  if (header_->count.value.fetch_add(1) + 1 == static_cast<uint32_t>(world_size_)) {
    header_->count.value.store(0);
    header_->generation.value.store(generation + 1);
    wake_all(header_->generation.value, header_->sleepers.value);
  } else {
    const bool ok = await([&] { return header_->generation.value.load() != generation; },
                          header_->generation.value, header_->sleepers.value, op.deadline, spin_);
    if (!ok) {
      std::string missing;
      for (int r = 0; r < world_size_; ++r) {
        if (static_cast<int32_t>(slots_[r].arrived.load() - epoch) < 0) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      throw Error(ErrorCode::kTimeout,
                  op.ctx.description() + ": timed out after " +
                      std::to_string(op.ctx.timeout.count()) + " ms waiting for rank(s) " +
                      (missing.empty() ? std::string("(all arrived late)") : missing) +
                      " (shm barrier)");
    }
  }
  if (!op.checked) {
    op.checked = true;
    for (int r = 0; r < world_size_; ++r) {
      const uint32_t theirs = slots_[r].tag[op.parity].load();
      if (theirs != op.ctx.tag) mismatch(op, r, theirs);
    }
  }
}

SmallSlot& ShmBackend::small_slot(int rank, uint32_t parity) const {
  return *reinterpret_cast<SmallSlot*>(small_ + (static_cast<size_t>(rank) * 2 + parity) *
                                                    kSmallSlotBytes);
}

char* ShmBackend::small_payload(int rank, uint32_t parity, size_t bytes) const {
  SmallSlot& slot = small_slot(rank, parity);
  return bytes <= kInlineBytes ? slot.inline_payload
                               : reinterpret_cast<char*>(&slot) + sizeof(SmallSlot);
}

// Publishes `bytes` of payload (at most kSmallBytes) for this op and waits until every rank has
// published its own; checks that they all called the same op. Two slots alternate, and a rank
// reaches op k + 2 only after every rank published op k + 1, that is, finished reading op k.
void ShmBackend::exchange(Op& op, const void* payload, size_t bytes) {
  SmallSlot& mine = small_slot(rank_, op.parity);
  if (bytes > 0) std::memcpy(small_payload(rank_, op.parity, bytes), payload, bytes);
  mine.tag = op.ctx.tag;
  mine.seq.store(op.seq);
  wake_all(mine.seq, mine.sleepers);
  for (int q = 0; q < world_size_; ++q) {
    if (q == rank_) continue;
    SmallSlot& theirs = small_slot(q, op.parity);
    if (!await([&] { return theirs.seq.load() == op.seq; }, theirs.seq, theirs.sleepers,
               op.deadline, spin_)) {
      std::string missing;
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_ && small_slot(r, op.parity).seq.load() != op.seq) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      throw Error(ErrorCode::kTimeout,
                  op.ctx.description() + ": timed out after " +
                      std::to_string(op.ctx.timeout.count()) + " ms waiting for rank(s) " +
                      missing + " (shm)");
    }
    if (theirs.tag != op.ctx.tag) mismatch(op, q, theirs.tag);
  }
  op.checked = true;
}

void ShmBackend::mismatch(const Op& op, int rank, uint32_t theirs) const {
  throw Error(ErrorCode::kRemoteError,
              op.ctx.description() + ": rank " + std::to_string(rank) +
                  " called a different op, or this op with another size, dtype, root or reduce "
                  "op (tags " + std::to_string(theirs) + " and " + std::to_string(op.ctx.tag) +
                  "): every rank must call the same ops in the same order");
}

#define TUTTI_SHM_BEGIN_OP(op_var, ctx_var)                                          \
  const uint32_t op_var##_seq = static_cast<uint32_t>(++ops_);                        \
  Op op_var{ctx_var, Clock::now() + (ctx_var).timeout, op_var##_seq, op_var##_seq & 1}; \
  slots_[rank_].tag[op_var.parity].store((ctx_var).tag)

void ShmBackend::barrier(const BarrierOptions&, const OpContext& ctx) {
  if (world_size_ == 1) return;
  TUTTI_SHM_BEGIN_OP(op, ctx);
  exchange(op, nullptr, 0);
}

void ShmBackend::broadcast(const std::vector<TensorView>& tensors, const BroadcastOptions& opts,
                           const OpContext& ctx) {
  if (world_size_ == 1) return;
  const TensorView& t = tensors[0];
  TUTTI_SHM_BEGIN_OP(op, ctx);
  auto* data = static_cast<char*>(t.data());
  const size_t total = t.nbytes();
  if (total <= kSmallBytes) {
    const bool root = rank_ == opts.root_rank;
    exchange(op, root ? data : nullptr, root ? total : 0);
    if (!root) std::memcpy(data, small_payload(opts.root_rank, op.parity, total), total);
    return;
  }
  for (size_t off = 0; off < total; off += chunk_) {
    const size_t len = std::min(chunk_, total - off);
    const int half = static_cast<int>(flips_++ & 1);
    if (rank_ == opts.root_rank) std::memcpy(stage(rank_, half), data + off, len);
    sync(op);
    if (rank_ != opts.root_rank) std::memcpy(data + off, stage(opts.root_rank, half), len);
  }
}

void ShmBackend::allreduce(const std::vector<TensorView>& tensors, const AllreduceOptions& opts,
                           const OpContext& ctx) {
  if (world_size_ == 1) return;  // the sum (or avg) of one rank is its own tensor
  TUTTI_SHM_BEGIN_OP(op, ctx);
  reduce_chunks(tensors[0], opts.reduce_op, -1, op);
}

void ShmBackend::reduce(const std::vector<TensorView>& tensors, const ReduceOptions& opts,
                        const OpContext& ctx) {
  if (world_size_ == 1) return;
  TUTTI_SHM_BEGIN_OP(op, ctx);
  reduce_chunks(tensors[0], opts.reduce_op, opts.root_rank, op);
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
    exchange(op, data, t.nbytes());
    if (!to_me) return;
    for (int q = 0; q < world_size_; ++q) inputs[q] = small_payload(q, op.parity, t.nbytes());
    detail::reduce_many(fn, data, inputs.data(), world_size_, n, es);
    if (avg) detail::scale_average(data, t.dtype(), n, world_size_);
    return;
  }

  // Chunks of up to chunk_ bytes; within a chunk rank q reduces slice q (of about len / W
  // elements) from every rank and publishes it; then the receivers copy the slices out.
  const size_t per_chunk = std::max<size_t>(1, chunk_ / es);
  for (size_t first = 0; first < n; first += per_chunk) {
    const size_t len = std::min(per_chunk, n - first);
    const int half = static_cast<int>(flips_++ & 1);
    auto slice_begin = [&](int q) { return len * static_cast<size_t>(q) / world_size_; };
    // Publish what the others reduce: every slice but our own.
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      const size_t b = slice_begin(q), e = slice_begin(q + 1);
      std::memcpy(stage(rank_, half) + b * es, data + (first + b) * es, (e - b) * es);
    }
    sync(op);
    // Our slice: our own input first (the output may alias only the first input), then the
    // others' in rank order. The result goes to our staging area for the others, and to our
    // tensor unless this is a reduce to another rank (whose non-roots keep their tensors).
    const size_t b = slice_begin(rank_), e = slice_begin(rank_ + 1);
    if (e > b) {
      inputs[0] = data + (first + b) * es;
      int k = 1;
      for (int q = 0; q < world_size_; ++q) {
        if (q != rank_) inputs[k++] = stage(q, half) + b * es;
      }
      char* published = stage(rank_, half) + b * es;
      char* target = to_me ? data + (first + b) * es : published;
      detail::reduce_many(fn, target, inputs.data(), world_size_, e - b, es);
      if (avg) detail::scale_average(target, t.dtype(), e - b, world_size_);
      if (target != published) std::memcpy(published, target, (e - b) * es);
    }
    sync(op);
    if (!to_me) continue;
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      const size_t qb = slice_begin(q), qe = slice_begin(q + 1);
      std::memcpy(data + (first + qb) * es, stage(q, half) + qb * es, (qe - qb) * es);
    }
  }
}

void ShmBackend::allgather(const std::vector<std::vector<TensorView>>& outputs,
                           const std::vector<TensorView>& inputs, const AllgatherOptions&,
                           const OpContext& ctx) {
  const TensorView& in = inputs[0];
  const std::vector<TensorView>& out = outputs[0];
  const auto* src = static_cast<const char*>(in.data());
  const size_t total = in.nbytes();
  if (world_size_ == 1) {
    if (out[0].data() != in.data()) std::memcpy(out[0].data(), src, total);
    return;
  }
  TUTTI_SHM_BEGIN_OP(op, ctx);
  if (total <= kSmallBytes) {
    exchange(op, src, total);
    for (int q = 0; q < world_size_; ++q) {
      char* dst = static_cast<char*>(out[q].data());
      const char* from = q == rank_ ? src : small_payload(q, op.parity, total);
      if (dst != from) std::memcpy(dst, from, total);
    }
    return;
  }
  for (size_t off = 0; off < total; off += chunk_) {
    const size_t len = std::min(chunk_, total - off);
    const int half = static_cast<int>(flips_++ & 1);
    std::memcpy(stage(rank_, half), src + off, len);
    sync(op);
    for (int q = 0; q < world_size_; ++q) {
      char* dst = static_cast<char*>(out[q].data()) + off;
      const char* from = q == rank_ ? src + off : stage(q, half);
      if (dst != from) std::memcpy(dst, from, len);
    }
  }
}

void ShmBackend::reduce_scatter(const std::vector<TensorView>& outputs,
                                const std::vector<std::vector<TensorView>>& inputs,
                                const ReduceScatterOptions& opts, const OpContext& ctx) {
  const TensorView& out = outputs[0];
  const std::vector<TensorView>& in = inputs[0];
  const size_t es = out.element_size();
  const size_t n = static_cast<size_t>(out.numel());
  if (world_size_ == 1) {
    if (out.data() != in[0].data()) std::memcpy(out.data(), in[0].data(), out.nbytes());
    return;
  }
  TUTTI_SHM_BEGIN_OP(op, ctx);
  const detail::ReduceFn fn = detail::reduce_function(out.dtype(), opts.reduce_op);
  std::vector<const void*>& sources = inputs_;
  // Each chunk holds `len` elements of every block, so W x len must fit a staging half.
  const size_t per_chunk = std::max<size_t>(1, chunk_ / es / world_size_);
  for (size_t first = 0; first < n; first += per_chunk) {
    const size_t len = std::min(per_chunk, n - first);
    const int half = static_cast<int>(flips_++ & 1);
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      std::memcpy(stage(rank_, half) + q * len * es,
                  static_cast<const char*>(in[q].data()) + first * es, len * es);
    }
    sync(op);
    sources[0] = static_cast<const char*>(in[rank_].data()) + first * es;
    int k = 1;
    for (int q = 0; q < world_size_; ++q) {
      if (q != rank_) sources[k++] = stage(q, half) + rank_ * len * es;
    }
    char* dst = static_cast<char*>(out.data()) + first * es;
    detail::reduce_many(fn, dst, sources.data(), world_size_, len, es);
    if (opts.reduce_op == ReduceOp::kAvg) detail::scale_average(dst, out.dtype(), len, world_size_);
  }
}

void ShmBackend::send(const std::vector<TensorView>& tensors, int dst_rank, const SendOptions&,
                      const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Channel& ch = channel(rank_, dst_rank);
  const auto deadline = Clock::now() + ctx.timeout;
  const auto* data = static_cast<const char*>(t.data());
  const size_t total = t.nbytes();
  for (size_t off = 0; off < total; off += mail_) {
    const size_t len = std::min(mail_, total - off);
    const uint32_t sent = ch.sent.value.load();
    // A slot is free once the receiver has taken what was written two chunks ago.
    if (!await([&] { return sent - ch.acked.value.load() < 2; }, ch.acked.value,
               ch.send_sleepers.value, deadline, spin_)) {
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for rank " + std::to_string(dst_rank) +
                                           " to receive");
    }
    const int slot = static_cast<int>(sent & 1);
    std::memcpy(mailbox(rank_, dst_rank, slot), data + off, len);
    ch.length[slot] = total;
    ch.sent.value.store(sent + 1);
    wake_all(ch.sent.value, ch.recv_sleepers.value);
  }
}

void ShmBackend::recv(const std::vector<TensorView>& tensors, int src_rank, const RecvOptions&,
                      const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Channel& ch = channel(src_rank, rank_);
  const auto deadline = Clock::now() + ctx.timeout;
  auto* data = static_cast<char*>(t.data());
  const size_t total = t.nbytes();
  for (size_t off = 0; off < total; off += mail_) {
    const size_t len = std::min(mail_, total - off);
    const uint32_t acked = ch.acked.value.load();
    if (!await([&] { return ch.sent.value.load() != acked; }, ch.sent.value,
               ch.recv_sleepers.value, deadline, spin_)) {
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for rank " + std::to_string(src_rank) +
                                           " to send");
    }
    const int slot = static_cast<int>(acked & 1);
    if (ch.length[slot] != total) {
      throw Error(ErrorCode::kRemoteError,
                  ctx.description() + ": rank " + std::to_string(src_rank) + " sent " +
                      std::to_string(ch.length[slot]) + " bytes, this rank receives " +
                      std::to_string(total));
    }
    std::memcpy(data + off, mailbox(src_rank, rank_, slot), len);
    ch.acked.value.store(acked + 1);
    wake_all(ch.acked.value, ch.send_sleepers.value);
  }
}

}  // namespace tutti::shm_backend
