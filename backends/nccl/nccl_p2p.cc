// The NCCL backend's point-to-point ops: send, recv and batch_p2p, on two-rank communicators, one
// per pair of (rank, GPU).
//
// batch_p2p uses those same pair communicators, all in one NCCL group, and not the collective
// communicator (which c10d uses for batched p2p): a batched send must meet a plain recv, and the
// k-th message between two ranks must meet the k-th receive whatever form each end used
// (P2POp's contract); NCCL matches messages per communicator, so both forms must share one. A
// batch cannot deadlock: every communicator it needs is made before any op is issued (all ids
// published before any is read, all inits started before any is awaited), and its sends and
// receives reach NCCL together, each communicator running on its own stream. The collective
// communicator would also be unusable for a batch that some ranks do not join: it is made
// collectively, by every rank of the group.
#include <algorithm>

#include "nccl_api.h"
#include "nccl_backend.h"
#include "nccl_types.h"
#include "nccl_util.h"

namespace tutti::nccl_backend {

// The peer's device for the single-tensor forms (kPeerDevice): each end publishes its own device
// and reads the other's, once per pair of ranks and local device; later ops reuse the answer.
// Both ends count their questions alike, so the n-th meets under ".../<n>/". An end that
// switches devices asks again, alone: its question then goes unanswered and fails at the
// store's timeout, naming what to do.
void NcclBackend::resolve_peer_devices(std::vector<Pair>& pairs, const OpContext& ctx) {
  struct Question {
    int peer;
    int device;
    std::string prefix;
  };
  std::vector<Question> asked;
  for (Pair& p : pairs) {
    if (p.peer_device != kPeerDevice) continue;
    if (auto it = peer_device_.find({p.peer, p.device}); it != peer_device_.end()) {
      p.peer_device = it->second;
      continue;
    }
    const bool seen = std::any_of(asked.begin(), asked.end(), [&](const Question& q) {
      return q.peer == p.peer && q.device == p.device;
    });
    if (seen) continue;
    const int low = std::min(rank_, p.peer), high = std::max(rank_, p.peer);
    asked.push_back({p.peer, p.device,
                     "nccl/peer-device/" + std::to_string(low) + "-" + std::to_string(high) + "/" +
                         std::to_string(peer_questions_[p.peer]++)});
  }
  // All answers out before any is read: ranks asking each other in a ring never wait in turn.
  for (const Question& q : asked) {
    store_->set(q.prefix + "/" + std::to_string(rank_), std::to_string(q.device));
  }
  for (const Question& q : asked) {
    std::string theirs;
    try {
      theirs = store_->get(q.prefix + "/" + std::to_string(q.peer));
    } catch (const Error& e) {
      throw Error(e.code(),
                  ctx.description() + ": rank " + std::to_string(q.peer) +
                      " did not say which GPU its matching op uses (" + e.what() +
                      "); single-tensor send/recv and P2POp::send/recv keep one GPU per pair of "
                      "ranks: name the peer's GPU (send_multigpu, P2POp::peer_device_index) to "
                      "use several");
    }
    peer_device_[{q.peer, q.device}] = std::atoi(theirs.c_str());
  }
  for (Pair& p : pairs) {
    if (p.peer_device == kPeerDevice) p.peer_device = peer_device_.at({p.peer, p.device});
  }
}

std::vector<NcclBackend::Comms*> NcclBackend::pair_comms(std::vector<Pair> pairs,
                                                         const OpContext& ctx) {
  resolve_peer_devices(pairs, ctx);
  std::vector<std::unique_ptr<Comms>> made;
  std::vector<Init> inits;
  std::map<std::string, Comms*> found;
  std::vector<Comms*> out;
  for (const Pair& p : pairs) {
    // Named the same from both ends.
    const bool low = rank_ < p.peer;
    const std::string me = std::to_string(rank_) + ":" + std::to_string(p.device);
    const std::string peer = std::to_string(p.peer) + ":" + std::to_string(p.peer_device);
    const std::string key = low ? me + "-" + peer : peer + "-" + me;
    if (auto it = found.find(key); it != found.end()) {
      out.push_back(it->second);
      continue;
    }
    Comms* c = nullptr;
    if (auto it = p2p_.find(key); it != p2p_.end()) {
      c = it->second.get();
    } else {
      made.push_back(std::make_unique<Comms>());
      c = made.back().get();
      c->devices = {p.device};
      c->nranks = 2;
      c->first_rank = low ? 0 : 1;
      inits.push_back({c, "nccl/p2p/" + key, low});
    }
    found[key] = c;
    out.push_back(c);
  }
  if (!inits.empty()) {
    init_comms(inits, ctx);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, c] : found) {
      for (auto& m : made) {
        if (m.get() == c) p2p_.emplace(key, std::move(m));
      }
    }
  }
  return out;
}

Backend::WorkPtr NcclBackend::send(const std::vector<TensorView>& tensors, int dst_rank,
                                   const SendOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Comms& c = *pair_comms({{t.device().index, dst_rank, opts.dst_device_index}}, ctx)[0];
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(api_.Send(t.data(), static_cast<size_t>(t.numel()), to_nccl(t.dtype()),
                         1 - c.first_rank, c.comms[0], c.streams[0]),
               c.comms[0], ctx, "ncclSend");
  });
}

Backend::WorkPtr NcclBackend::recv(const std::vector<TensorView>& tensors, int src_rank,
                                   const RecvOptions& opts, const OpContext& ctx) {
  const TensorView& t = tensors[0];
  Comms& c = *pair_comms({{t.device().index, src_rank, opts.src_device_index}}, ctx)[0];
  return launch(lanes_of(c), opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    DeviceGuard guard(c.devices[0]);
    check_nccl(api_.Recv(t.data(), static_cast<size_t>(t.numel()), to_nccl(t.dtype()),
                         1 - c.first_rank, c.comms[0], c.streams[0]),
               c.comms[0], ctx, "ncclRecv");
  });
}

Backend::WorkPtr NcclBackend::batch_p2p(const std::vector<P2PRequest>& requests,
                                        const BatchP2POptions& opts, const OpContext& ctx) {
  std::vector<Pair> pairs;
  for (const P2PRequest& r : requests) {
    pairs.push_back({r.tensor.device().index, r.peer, r.peer_device_index});
  }
  const std::vector<Comms*> comms = pair_comms(std::move(pairs), ctx);
  std::vector<Lane> lanes;
  for (Comms* c : comms) {
    const bool listed =
        std::any_of(lanes.begin(), lanes.end(), [&](const Lane& l) { return l.c == c; });
    if (!listed) lanes.push_back({c, 0});
  }
  return launch(lanes, opts, ctx, [&](Phase phase) {
    if (phase != Phase::kNccl) return;
    // In the order given: NCCL matches the messages of one communicator in order.
    for (size_t n = 0; n < requests.size(); ++n) {
      const P2PRequest& r = requests[n];
      Comms& c = *comms[n];
      DeviceGuard guard(c.devices[0]);
      const size_t count = static_cast<size_t>(r.tensor.numel());
      const int peer = 1 - c.first_rank;
      if (r.kind == P2POp::Kind::kSend) {
        check_nccl(api_.Send(r.tensor.data(), count, to_nccl(r.tensor.dtype()), peer, c.comms[0],
                             c.streams[0]),
                   c.comms[0], ctx, "ncclSend (batch)");
      } else {
        check_nccl(api_.Recv(r.tensor.data(), count, to_nccl(r.tensor.dtype()), peer, c.comms[0],
                             c.streams[0]),
                   c.comms[0], ctx, "ncclRecv (batch)");
      }
    }
  });
}

}  // namespace tutti::nccl_backend
