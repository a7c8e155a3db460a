// The shm backend's point-to-point messages: chunks through each (sender, receiver) pair's
// two-slot mailbox. A plain send or recv is a batch of one; a batch advances every message it
// can, then sleeps on this rank's doorbell until a peer fills or frees a slot of it.
#include <cstring>

#include "shm_internal.h"

namespace tutti::shm_backend {
namespace {

// A send's time is its copies into the mailbox, which include the receiver's copies out of it
// for all but the last two chunks (the sender waits for their slots). For fewer chunks the
// sender's time leaves out what streaming stores cost the receiver, and the probes chose them
// wrongly: 256 KiB sendrecv went from 20-23 us to 36-41 with the CPUs near (1 MiB, 4 chunks:
// 75-89 to 85-105); from 4 MiB they were even.
constexpr size_t kTimedChunks = 8;

std::string message(const SlotMeta& m) {
  const auto dtype = static_cast<DType>(m.dtype);
  return std::string(to_string(dtype)) + "[" + std::to_string(m.bytes / dtype_size(dtype)) +
         "] (message #" + std::to_string(m.seq) + ")";
}

}  // namespace

Backend::WorkPtr ShmBackend::send(const std::vector<TensorView>& tensors, int dst_rank,
                                  const SendOptions&, const OpContext& ctx) {
  P2PRequest r;
  r.kind = P2POp::Kind::kSend;
  r.tensor = tensors[0];
  r.peer = dst_rank;
  r.seq = ctx.seq;
  r.tag = ctx.tag;
  std::vector<Transfer> one{Transfer{&r, r.tensor.nbytes(), 0}};
  run_batch(one, ctx);
  return nullptr;
}

Backend::WorkPtr ShmBackend::recv(const std::vector<TensorView>& tensors, int src_rank,
                                  const RecvOptions&, const OpContext& ctx) {
  P2PRequest r;
  r.kind = P2POp::Kind::kRecv;
  r.tensor = tensors[0];
  r.peer = src_rank;
  r.seq = ctx.seq;
  r.tag = ctx.tag;
  std::vector<Transfer> one{Transfer{&r, r.tensor.nbytes(), 0}};
  run_batch(one, ctx);
  return nullptr;
}

Backend::WorkPtr ShmBackend::batch_p2p(const std::vector<P2PRequest>& requests,
                                       const BatchP2POptions&, const OpContext& ctx) {
  std::vector<Transfer> transfers;
  transfers.reserve(requests.size());
  for (const P2PRequest& r : requests) transfers.push_back(Transfer{&r, r.tensor.nbytes(), 0});
  run_batch(transfers, ctx);
  return nullptr;
}

// Whether the next chunk of t can move now: a free slot to send into, a full one to take.
bool ShmBackend::can_advance(const Transfer& t) const {
  const P2PRequest& r = *t.request;
  if (r.kind == P2POp::Kind::kSend) {
    const Channel& ch = channel(rank_, r.peer);
    return ch.sent.load() - ch.acked.load() < 2;
  }
  const Channel& ch = channel(r.peer, rank_);
  return ch.sent.load() != ch.acked.load();
}

// Moves as many chunks of t as the mailbox allows; true when any moved.
bool ShmBackend::advance(Transfer& t, const OpContext& ctx) {
  const P2PRequest& r = *t.request;
  bool moved = false;
  while (!t.finished() && can_advance(t)) {
    const size_t len = std::min(mail_, t.bytes - t.done);
    if (r.kind == P2POp::Kind::kSend) {
      Channel& ch = channel(rank_, r.peer);
      const uint32_t sent = ch.sent.load();
      const int slot = static_cast<int>(sent & 1);
      // Messages of kTimedChunks chunks and more only (see shm_publish.h).
      if (t.done == 0 && t.bytes >= kTimedChunks * mail_) {
        t.how = publish_.pick(PublishChooser::kSend, t.bytes);
      }
      // Timed from the third chunk: the first two go before the receiver has to be there.
      if (t.how.timed && t.done == 2 * mail_) {
        t.switches = involuntary_switches();
        t.cpu_ns = thread_cpu_ns();
        t.started = detail::op_now();
      }
      publish(t.how, mailbox(rank_, r.peer, slot),
              static_cast<const char*>(r.tensor.data()) + t.done, len);
      if (t.how.timed && t.done + len == t.bytes) {
        // A send's time is its wall clock's (it waits for the receiver's acks, and the
        // receiver's reads are part of the way's cost), left out where this rank was off its
        // CPU for more of it than shm_cpus.h's off_cpu_counts lets pass.
        const Clock::duration took = detail::op_now() - t.started;
        published(PublishChooser::kSend, t.bytes, t.how, took,
                  off_cpu_counts(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count(),
                                 thread_cpu_ns() - t.cpu_ns, involuntary_switches() - t.switches));
      }
      ch.meta[slot] = SlotMeta{r.tag, static_cast<uint32_t>(r.tensor.dtype()), t.bytes, r.seq};
      ch.sent.store(sent + 1);
      ring(r.peer);
    } else {
      Channel& ch = channel(r.peer, rank_);
      const uint32_t acked = ch.acked.load();
      const int slot = static_cast<int>(acked & 1);
      const SlotMeta theirs = ch.meta[slot];
      if (theirs.tag != r.tag || theirs.bytes != t.bytes) {
        const SlotMeta mine{r.tag, static_cast<uint32_t>(r.tensor.dtype()), t.bytes, r.seq};
        throw Error(ErrorCode::kRemoteError,
                    ctx.description() + ": rank " + std::to_string(r.peer) + " sent " +
                        message(theirs) + ", this rank receives " + message(mine) +
                        ": sends and receives must match in order, size and dtype");
      }
      std::memcpy(static_cast<char*>(r.tensor.data()) + t.done, mailbox(r.peer, rank_, slot), len);
      ch.acked.store(acked + 1);
      ring(r.peer);
    }
    t.done += len;
    moved = true;
  }
  return moved;
}

void ShmBackend::run_batch(std::vector<Transfer>& transfers, const OpContext& ctx) {
  if (world_size_ == 1 || transfers.empty()) return;
  throw_if_stopped(ctx, 0);
  struct InP2P {
    std::atomic<uint32_t>& word;
    explicit InP2P(std::atomic<uint32_t>& w) : word(w) { word.store(1, std::memory_order_relaxed); }
    ~InP2P() { word.store(0, std::memory_order_relaxed); }
  } in_p2p(bells_[rank_].in_p2p.value);
  for (const Transfer& t : transfers) {
    const bool sending = t.request->kind == P2POp::Kind::kSend;
    ensure_mailbox(sending ? rank_ : t.request->peer, sending ? t.request->peer : rank_, ctx);
  }
  const auto deadline = ctx.deadline();
  // Messages to one peer in one direction go in order: only the first unfinished one of each
  // (peer, direction) may move.
  std::vector<Transfer*> head(static_cast<size_t>(world_size_) * 2);
  auto heads = [&] {
    std::fill(head.begin(), head.end(), nullptr);
    for (Transfer& t : transfers) {
      if (t.finished()) continue;
      const size_t key = static_cast<size_t>(t.request->peer) * 2 +
                         (t.request->kind == P2POp::Kind::kSend ? 0 : 1);
      if (head[key] == nullptr) head[key] = &t;
    }
  };
  auto pending_with = [&](int r) { return head[r * 2] != nullptr || head[r * 2 + 1] != nullptr; };
  while (true) {
    heads();
    bool any = false, moved = false;
    for (Transfer* t : head) {
      if (t == nullptr) continue;
      any = true;
      moved |= advance(*t, ctx);
    }
    if (!any) return;
    if (moved) continue;
    Bell& bell = bells_[rank_];
    wait_until(
        [&] {
          for (Transfer* t : head) {
            if (t != nullptr && can_advance(*t)) return true;
          }
          return false;
        },
        bell.ring.value, bell.sleepers.value, ctx, 0, deadline, pending_with,
        [&] {
          std::string waits;
          for (int r = 0; r < world_size_; ++r) {
            if (head[r * 2] != nullptr) {
              waits += std::string(waits.empty() ? "" : ", ") + "rank " + std::to_string(r) +
                       " to receive";
            }
            if (head[r * 2 + 1] != nullptr) {
              waits +=
                  std::string(waits.empty() ? "" : ", ") + "rank " + std::to_string(r) + " to send";
            }
          }
          throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                               std::to_string(ctx.timeout.count()) +
                                               " ms waiting for " + waits);
        });
  }
}

}  // namespace tutti::shm_backend
