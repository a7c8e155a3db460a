#include "gloo_direct_exchange.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "gloo_store.h"
#include "tutti/error.h"
#include "tutti/prefix_store.h"
#include "util/tcp_link.h"

namespace tutti::gloo_backend {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(DirectExchange::Header) == 16, "a header is 16 bytes on the wire");

// Header::magic: which algorithm sent it.
enum class Kind : uint32_t {
  kDirect = 0x74757444,
  kDoubling = 0x74757448,
  kRing = 0x74757452,
  kBarrier = 0x74757442,
  kBroadcast = 0x74757462,
  kAllgather = 0x74757467,
  kReduce = 0x74757472,
  kReduceScatter = 0x74757473,
  kReduceRing = 0x74757470,
  // What the receivers of a broadcast and the root of a reduce send back on entering it: a rank
  // that sends only learns that its peers are in the same op (a peer that thinks itself the root
  // of a broadcast sends data instead: at 2 ranks both fail naming it; see the header).
  kBroadcastAck = 0x74757441,
  kReduceAck = 0x74757461,
  kP2P = 0x74757450
};

const char* kind_name(uint32_t magic) {
  switch (static_cast<Kind>(magic)) {
    case Kind::kDirect: return "the direct exchange";
    case Kind::kDoubling: return "recursive doubling";
    case Kind::kRing: return "the ring";
    case Kind::kBarrier: return "a barrier";
    case Kind::kBroadcast: return "a broadcast";
    case Kind::kAllgather: return "an allgather";
    case Kind::kReduce: return "a reduce";
    case Kind::kReduceScatter: return "a reduce_scatter";
    case Kind::kReduceRing: return "a reduce by the ring";
    case Kind::kBroadcastAck: return "a broadcast's receiver";
    case Kind::kReduceAck: return "a reduce's root";
    case Kind::kP2P: return "a send";
  }
  return "no tutti header";
}

// How long a wait polls before it sleeps. A round trip on loopback takes ~15 us and a peer
// that is late by a scheduling slice takes milliseconds: polling covers the first and gives up
// long before the second. Every turn yields the core, so polling costs a peer that shares the
// core little.
// TUTTI_GLOO_SPIN_US sets it: 0 to 10000 us (more would hold a core for each wait; a value
// that is not a number in that range leaves the default, 200).
std::chrono::microseconds spin_budget() {
  static const std::chrono::microseconds budget = [] {
    const char* v = std::getenv("TUTTI_GLOO_SPIN_US");
    char* end = nullptr;
    const long us = v != nullptr ? std::strtol(v, &end, 10) : -1;
    const bool valid = v != nullptr && *v != '\0' && end != nullptr && *end == '\0' && us >= 0;
    return std::chrono::microseconds(valid ? std::min(us, 10000L) : 200L);
  }();
  return budget;
}

size_t left_in(const iovec* v) {
  return v[0].iov_len + v[1].iov_len;
}

void advance(iovec* v, size_t n) {
  for (int i = 0; i < 2 && n > 0; ++i) {
    const size_t k = std::min(n, v[i].iov_len);
    v[i].iov_base = static_cast<char*>(v[i].iov_base) + k;
    v[i].iov_len -= k;
    n -= k;
  }
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

DirectExchange::DirectExchange(int rank, int world_size, const std::shared_ptr<tutti::Store>& store,
                               const std::shared_ptr<::gloo::transport::Device>& device,
                               std::chrono::milliseconds timeout,
                               const std::vector<size_t>& send_buffers)
    : rank_(rank), world_size_(world_size) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, world_size);
  context->setTimeout(timeout);
  GlooStore prefixed(
      std::make_shared<PrefixStore>("direct", store),
      [this](int r, const std::vector<char>& addresses) { connections_.record(r, addresses); });
  auto shared_device = device;  // connectFullMesh takes a non-const reference
  context->connectFullMesh(prefixed, shared_device);
  context_ = std::move(context);
  connections_.find(rank_, world_size_);

  fds_.assign(world_size_, -1);
  inbox_.resize(world_size_);
  headers_.resize(sizeof(Header) * world_size_);
  staging_.resize(kStagingBytes);
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    // Synchronous mode takes the socket out of Gloo's event loop: from here only this class
    // reads and writes it (Gloo's pair keeps it open until the context goes).
    context_->getPair(p)->setSync(/*enable=*/true, /*busyPoll=*/false);
    fds_[p] = connections_.socket_for(p);
    if (fds_[p] < 0) {
      throw Error(ErrorCode::kInternal,
                  "gloo: the socket of the second context's connection to rank " +
                      std::to_string(p) + " was not found");
    }
    if (static_cast<size_t>(p) < send_buffers.size() && send_buffers[p] > 0) {
      const int v = static_cast<int>(std::min<size_t>(send_buffers[p], INT_MAX / 2));
      ::setsockopt(fds_[p], SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
    }
  }
}

DirectExchange::~DirectExchange() {
  context_.reset();
}

void DirectExchange::run(std::vector<Flow>& flows, Clock::time_point deadline,
                         const OpContext& ctx) {
  auto failed_with = [&](int peer, const std::string& why) {
    throw Error(ErrorCode::kIoError, ctx.description() + ": the connection to rank " +
                                         std::to_string(peer) + " failed: " + why);
  };
  auto failed = [&](int peer, int err) { failed_with(peer, detail::socket_error_text(err)); };
  std::vector<pollfd> polls;
  auto spin_end = Clock::now() + spin_budget();
  std::vector<detail::LinkWatch> links;  // per peer, made at the first look
  // The first look a quarter of the bound in (an op that ends sooner never looks).
  Clock::time_point next_link_look = spin_end + detail::link_timeout() / 4;
  for (;;) {
    bool pending = false;
    bool moved = false;
    for (Flow& f : flows) {
      const int fd = fds_[f.peer];
      if (left_in(f.out) > 0) {
        msghdr m{};
        m.msg_iov = f.out;
        m.msg_iovlen = 2;
        const ssize_t rv = ::sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (rv > 0) {
          advance(f.out, static_cast<size_t>(rv));
          moved = true;
          if (f.queue >= 0 && left_in(f.out) == 0) next_send(f);
        } else if (rv < 0 && !would_block(errno)) {
          failed(f.peer, errno);
        }
      }
      if (left_in(f.in) > 0) {
        msghdr m{};
        m.msg_iov = f.in;
        m.msg_iovlen = f.header_alone && f.in[0].iov_len > 0 ? 1 : 2;
        const ssize_t rv = ::recvmsg(fd, &m, MSG_DONTWAIT);
        if (rv > 0) {
          const bool header_was_due = f.magic != 0 && f.in[0].iov_len > 0;
          advance(f.in, static_cast<size_t>(rv));
          moved = true;
          // The header first: a peer in another op is told apart before its data is waited for.
          if (header_was_due && f.in[0].iov_len == 0) {
            check_header(f.peer, headers_.data() + sizeof(Header) * f.peer, f, ctx);
          }
          if (f.arrived) f.arrived(f, static_cast<size_t>(rv));
          if (f.queue >= 0 && left_in(f.in) == 0) next_receive(f);
        } else if (rv == 0) {
          throw Error(ErrorCode::kIoError,
                      ctx.description() + ": rank " + std::to_string(f.peer) +
                          " closed its connection (it ended, failed or aborted)");
        } else if (!would_block(errno)) {
          failed(f.peer, errno);
        }
      }
    }
    // After every flow had its turn: a receive's `arrived` may have given a flow more to send.
    for (const Flow& f : flows) pending = pending || left_in(f.out) > 0 || left_in(f.in) > 0;
    if (!pending) return;
    const auto now = Clock::now();
    if (moved && now < deadline) {  // a peer that sends slowly still ends at the deadline
      spin_end = now + spin_budget();
      continue;
    }
    if (now >= deadline) {
      std::vector<int> receiving;
      std::vector<int> sending;
      for (const Flow& f : flows) {
        if (left_in(f.in) > 0) receiving.push_back(f.peer);
        if (left_in(f.out) > 0) sending.push_back(f.peer);
      }
      // Point-to-point flows name what each peer has yet to do.
      const bool p2p = flows.front().queue >= 0;
      const std::string who =
          !receiving.empty()
              ? ranks_text(receiving) + (p2p ? " to send" : "")
              : ranks_text(sending) + (p2p ? " to receive" : " to take this rank's data");
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for " + who);
    }
    if (now < spin_end) {
      ::sched_yield();
      continue;
    }
    polls.clear();
    for (const Flow& f : flows) {
      const short events =
          static_cast<short>((left_in(f.out) > 0 ? POLLOUT : 0) | (left_in(f.in) > 0 ? POLLIN : 0));
      if (events != 0) polls.push_back(pollfd{fds_[f.peer], events, 0});
    }
    // Whole milliseconds, rounded up, and at most a minute per poll (deadlines can be far), or
    // until the next look at the links (a quarter of their bound, 200 ms after one looked cut):
    // a peer whose host went silent is named within the bound, not at the op's deadline.
    const int64_t bound = detail::link_timeout().count();
    int64_t cap = 60000;
    if (bound > 0) {
      const auto to_look =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_link_look - now);
      cap = std::clamp<int64_t>(to_look.count() + 1, 1, std::min<int64_t>(60000, bound / 4));
    }
    const auto ms = std::min<int64_t>(
        cap, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
    ::poll(polls.data(), polls.size(), static_cast<int>(ms));  // then the loop reads what came
    spin_end = Clock::now() + spin_budget();
    // The links of the flows still waiting, every quarter of the bound whatever poll said (a
    // signal, or another peer's bytes, may wake it every time).
    if (bound > 0 && spin_end >= next_link_look) {
      next_link_look = spin_end + std::chrono::milliseconds(bound / 4);
      if (links.empty()) links.resize(world_size_);
      for (const Flow& f : flows) {
        if (left_in(f.out) == 0 && left_in(f.in) == 0) continue;
        long silent = 0;
        if (links[f.peer].cut(fds_[f.peer], silent)) {
          failed_with(f.peer, detail::link_cut_text(silent));
        }
        if (links[f.peer].suspect()) {
          next_link_look = std::min(next_link_look, spin_end + detail::LinkWatch::kSecondLook);
        }
      }
    }
  }
}

void DirectExchange::check_header(int peer, const char* header, const Flow& f,
                                  const OpContext& ctx) const {
  Header theirs;
  std::memcpy(&theirs, header, sizeof(theirs));
  const uint32_t magic = f.magic;
  const uint64_t total = f.total;
  if (theirs.magic != magic || theirs.tag != f.tag || theirs.bytes != total) {
    throw Error(ErrorCode::kRemoteError,
                ctx.description() + ": rank " + std::to_string(peer) +
                    " called a different op or size (its message: " + std::to_string(theirs.bytes) +
                    " bytes, tag " + std::to_string(theirs.tag) + " by " + kind_name(theirs.magic) +
                    "; expected here: " + std::to_string(total) + " bytes, tag " +
                    std::to_string(f.tag) + " by " + kind_name(magic) +
                    "); every rank must make the same calls in the same order" +
                    (f.queue >= 0 ? std::string(" (sends and receives in the same order per pair)")
                                  : std::string(", with the same TUTTI_GLOO_ALLREDUCE and "
                                                "TUTTI_GLOO_DIRECT_BYTES")));
  }
}

void DirectExchange::allreduce_direct(void* data, size_t bytes, size_t element_size,
                                      detail::ReduceFn fn, const OpContext& ctx) {
  if (world_size_ == 1) return;
  const Header mine{static_cast<uint32_t>(Kind::kDirect), ctx.tag, bytes};
  std::vector<Flow> flows;
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ + k) % world_size_;
    if (inbox_[p].size() < bytes) inbox_[p].resize(bytes);
    flows.push_back(exchange_flow(p, mine, data, inbox_[p].data()));
  }
  run(flows, ctx.deadline(), ctx);
  fold_in_rank_order(data, data, rank_, bytes / element_size, fn);
  trim_inboxes();  // TUTTI_GLOO_ALLREDUCE=direct takes any size
}

void DirectExchange::fold_in_rank_order(void* out, const void* mine, int me, size_t count,
                                        detail::ReduceFn fn) {
  // ((d_0 fn d_1) fn d_2) ... on every rank, so all of them compute the same bits. The last step
  // writes the output, which may be `mine`: the kernels are element-wise, and nothing before the
  // last step writes it unless it is the accumulator (me == 0), whose element i is read before
  // it is written.
  auto input = [&](int r) -> const void* { return r == me ? mine : inbox_[r].data(); };
  void* acc = me == 0 ? out : inbox_[0].data();
  const void* partial = input(0);
  for (int r = 1; r < world_size_ - 1; ++r) {
    fn(acc, partial, input(r), count);
    partial = acc;
  }
  fn(out, partial, input(world_size_ - 1), count);
}

void DirectExchange::allreduce_doubling(void* data, size_t bytes, size_t element_size,
                                        detail::ReduceFn fn, const OpContext& ctx) {
  if (!is_power_of_two(world_size_)) {
    throw Error(ErrorCode::kInternal, ctx.description() +
                                          ": recursive doubling needs a power of "
                                          "two ranks, not " +
                                          std::to_string(world_size_));
  }
  const auto deadline = ctx.deadline();
  const size_t count = bytes / element_size;
  // One receive buffer for every step (each ends before the next): this rank's own inbox slot,
  // which nothing else uses.
  std::vector<char>& inbox = inbox_[rank_];
  if (inbox.size() < bytes) inbox.resize(bytes);
  const Header mine{static_cast<uint32_t>(Kind::kDoubling), ctx.tag, bytes};
  std::vector<Flow> flows(1);
  // Step k: exchange the partial sums with the rank whose number differs in bit k. Both compute
  // (lower group's sum) fn (upper group's sum), so the two, and in the end every rank, hold the
  // same bits.
  for (int bit = 1; bit < world_size_; bit <<= 1) {
    const int peer = rank_ ^ bit;
    flows[0] = exchange_flow(peer, mine, data, inbox.data());
    run(flows, deadline, ctx);
    if (rank_ < peer) {
      fn(data, data, inbox.data(), count);
    } else {
      fn(data, inbox.data(), data, count);
    }
  }
  trim_inboxes();  // TUTTI_GLOO_ALLREDUCE=doubling takes any size
}

void DirectExchange::allreduce_ring(void* data, size_t bytes, size_t element_size,
                                    detail::ReduceFn fn, const OpContext& ctx) {
  ring(data, bytes, element_size, fn, static_cast<uint32_t>(Kind::kRing), ctx);
}

void DirectExchange::ring(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                          uint32_t magic, const OpContext& ctx) {
  if (world_size_ == 1) return;
  const auto deadline = ctx.deadline();
  const int n = world_size_;
  const int right = (rank_ + 1) % n;
  const int left = (rank_ - 1 + n) % n;
  const size_t count = bytes / element_size;
  char* base = static_cast<char*>(data);
  // Block b: elements [count * b / n, count * (b + 1) / n).
  auto begin = [&](int b) { return count * static_cast<size_t>(b) / n * element_size; };
  auto length = [&](int b) { return begin(b + 1) - begin(b); };
  const Header mine{magic, ctx.tag, bytes};

  // One step: send block `send_b` to the right while block `recv_b` comes from the left; folded
  // into the output through the staging buffer (reduce-scatter) or written to it (allgather).
  auto step = [&](int send_b, int recv_b, bool fold, bool header) {
    const size_t in_len = length(recv_b);
    char* dst = base + begin(recv_b);
    size_t staged = 0;  // bytes in the staging buffer (from its start)
    size_t used = 0;    // of those, folded into dst
    size_t done = 0;    // bytes of dst folded
    Flow to;
    to.peer = right;
    to.out[0] = {const_cast<Header*>(&mine), header ? sizeof(Header) : 0};
    to.out[1] = {base + begin(send_b), length(send_b)};
    Flow from;
    from.peer = left;
    if (header) {
      from.in[0] = {headers_.data() + sizeof(Header) * left, sizeof(Header)};
      from.magic = mine.magic;
      from.total = bytes;
      from.tag = mine.tag;
    }
    from.in[1] =
        fold ? iovec{staging_.data(), std::min(kStagingBytes, in_len)} : iovec{dst, in_len};
    // What came into the staging buffer (the header, if any, is in[0] and comes first) is folded
    // into the output in whole elements.
    size_t header_left = header ? sizeof(Header) : 0;
    auto fold_in = [&](Flow& f, size_t got) {
      const size_t h = std::min(got, header_left);
      header_left -= h;
      got -= h;
      if (got == 0) return;
      staged += got;
      const size_t ready = staged / element_size * element_size;
      if (ready > used) {
        fn(dst + done, dst + done, staging_.data() + used, (ready - used) / element_size);
        done += ready - used;
        used = ready;
      }
      // The staging buffer is full, and all of it folded (its size and every block's are whole
      // elements): start it again for the rest of the block.
      if (f.in[1].iov_len == 0 && done < in_len) {
        staged = used = 0;
        f.in[1] = iovec{staging_.data(), std::min(kStagingBytes, in_len - done)};
      }
    };
    if (fold) from.arrived = fold_in;
    std::vector<Flow> flows;
    if (left == right) {  // two ranks: one connection both ways
      to.in[0] = from.in[0];
      to.in[1] = from.in[1];
      to.magic = from.magic;
      to.total = from.total;
      to.tag = from.tag;
      to.arrived = std::move(from.arrived);
      flows.push_back(std::move(to));
    } else {
      flows.push_back(std::move(to));
      flows.push_back(std::move(from));
    }
    run(flows, deadline, ctx);
  };
  // Reduce-scatter: after step s this rank holds blocks (rank - s - 1) summed over s + 2 ranks;
  // after n - 1 steps, block (rank + 1) over all of them.
  for (int s = 0; s < n - 1; ++s) {
    step((rank_ - s + n) % n, (rank_ - s - 1 + n) % n, /*fold=*/true, /*header=*/s == 0);
  }
  // Allgather: each rank's finished block travels once around the ring.
  for (int s = 0; s < n - 1; ++s) {
    step((rank_ + 1 - s + n) % n, (rank_ - s + n) % n, /*fold=*/false, /*header=*/false);
  }
}

void DirectExchange::barrier(const OpContext& ctx) {
  const Header mine{static_cast<uint32_t>(Kind::kBarrier), ctx.tag, 0};
  std::vector<Flow> flows;
  for (int k = 1; k < world_size_; ++k) {
    flows.push_back(exchange_flow((rank_ + k) % world_size_, mine, nullptr, nullptr));
  }
  run(flows, ctx.deadline(), ctx);
}

void DirectExchange::broadcast(void* data, size_t bytes, int root, bool chain,
                               const OpContext& ctx) {
  const int n = world_size_;
  if (n == 1) return;
  const Header mine{static_cast<uint32_t>(Kind::kBroadcast), ctx.tag, bytes};
  const Header ack{static_cast<uint32_t>(Kind::kBroadcastAck), ctx.tag, bytes};
  std::vector<Flow> flows;
  if (!chain || n == 2) {
    if (rank_ == root) {
      for (int k = 1; k < n; ++k) flows.push_back(send_flow((root + k) % n, mine, data, ack));
    } else {
      flows.push_back(receive_flow(root, mine, data, ack));
    }
    run(flows, ctx.deadline(), ctx);
    return;
  }
  // The chain root, root + 1, ..., root + n - 1: each rank but the root takes the bytes from its
  // left and, but the last, passes each piece to its right as soon as it is in.
  const int position = (rank_ - root + n) % n;
  const int right = (rank_ + 1) % n;
  const int left = (rank_ - 1 + n) % n;
  if (position == 0) {
    flows.push_back(send_flow(right, mine, data, ack));
    run(flows, ctx.deadline(), ctx);
    return;
  }
  flows.reserve(2);
  flows.push_back(receive_flow(left, mine, data, ack));
  // What the passing on below counts, alive until run() returns.
  char* const base = static_cast<char*>(data);
  size_t header_left = sizeof(Header);
  size_t received = 0;
  if (position < n - 1) {
    flows.push_back(send_flow(right, mine, data, ack));
    flows[1].out[1].iov_len = 0;  // grows as the bytes come
    flows[0].arrived = [&flows, &header_left, &received, base](Flow&, size_t got) {
      const size_t h = std::min(got, header_left);
      header_left -= h;
      received += got - h;
      // What is in and not yet passed on: from where the send stands to the end of what came.
      iovec& onward = flows[1].out[1];
      onward.iov_len = static_cast<size_t>(base + received - static_cast<char*>(onward.iov_base));
    };
  }
  run(flows, ctx.deadline(), ctx);
}

void DirectExchange::allgather(const void* in, size_t bytes, void* out, const OpContext& ctx) {
  char* o = static_cast<char*>(out);
  if (o + static_cast<size_t>(rank_) * bytes != in) {
    std::memcpy(o + static_cast<size_t>(rank_) * bytes, in, bytes);
  }
  const Header mine{static_cast<uint32_t>(Kind::kAllgather), ctx.tag, bytes};
  std::vector<Flow> flows;
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ + k) % world_size_;
    flows.push_back(exchange_flow(p, mine, in, o + static_cast<size_t>(p) * bytes, true));
  }
  run(flows, ctx.deadline(), ctx);
}

void DirectExchange::reduce(void* data, size_t bytes, size_t element_size, detail::ReduceFn fn,
                            int root, bool by_ring, const OpContext& ctx) {
  if (world_size_ == 1) return;
  if (by_ring && world_size_ > 2) {
    // The root's data is its output; the others' is input only: theirs goes round on a copy.
    void* sum = data;
    if (rank_ != root) {
      std::vector<char>& copy = inbox_[rank_];
      if (copy.size() < bytes) copy.resize(bytes);
      std::memcpy(copy.data(), data, bytes);
      sum = copy.data();
    }
    ring(sum, bytes, element_size, fn, static_cast<uint32_t>(Kind::kReduceRing), ctx);
    trim_inboxes();
    return;
  }
  const Header mine{static_cast<uint32_t>(Kind::kReduce), ctx.tag, bytes};
  const Header ack{static_cast<uint32_t>(Kind::kReduceAck), ctx.tag, bytes};
  std::vector<Flow> flows;
  if (rank_ != root) {
    flows.push_back(send_flow(root, mine, data, ack));
    run(flows, ctx.deadline(), ctx);
    return;
  }
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ + k) % world_size_;
    if (inbox_[p].size() < bytes) inbox_[p].resize(bytes);
    flows.push_back(receive_flow(p, mine, inbox_[p].data(), ack));
  }
  run(flows, ctx.deadline(), ctx);
  fold_in_rank_order(data, data, rank_, bytes / element_size, fn);
  trim_inboxes();
}

void DirectExchange::reduce_scatter(const std::vector<const void*>& blocks, void* out, size_t bytes,
                                    size_t element_size, detail::ReduceFn fn,
                                    const OpContext& ctx) {
  const Header mine{static_cast<uint32_t>(Kind::kReduceScatter), ctx.tag, bytes};
  std::vector<Flow> flows;
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ + k) % world_size_;
    if (inbox_[p].size() < bytes) inbox_[p].resize(bytes);
    flows.push_back(exchange_flow(p, mine, blocks[p], inbox_[p].data()));
  }
  run(flows, ctx.deadline(), ctx);
  fold_in_rank_order(out, blocks[rank_], rank_, bytes / element_size, fn);
  trim_inboxes();
}

void DirectExchange::trim_inboxes() {
  size_t kept = 0;
  for (const std::vector<char>& inbox : inbox_) kept += inbox.capacity();
  if (kept <= kept_inbox_bytes_) return;
  for (std::vector<char>& inbox : inbox_) std::vector<char>().swap(inbox);
}

void DirectExchange::p2p(const std::vector<Message>& messages, const OpContext& ctx) {
  std::vector<int> flow_of(world_size_, -1);
  queues_.clear();
  std::vector<Flow> flows;
  for (const Message& m : messages) {
    int& at = flow_of[m.peer];
    if (at < 0) {
      at = static_cast<int>(flows.size());
      flows.emplace_back();
      flows.back().peer = m.peer;
      flows.back().queue = at;
      queues_.emplace_back();
    }
    PeerQueue& q = queues_[at];
    if (m.send) {
      q.sends.push_back(&m);
      q.headers.push_back(Header{static_cast<uint32_t>(Kind::kP2P), m.tag, m.bytes});
    } else {
      q.receives.push_back(&m);
    }
  }
  for (Flow& f : flows) {
    next_send(f);
    next_receive(f);
  }
  run(flows, ctx.deadline(), ctx);
}

bool DirectExchange::next_send(Flow& f) {
  PeerQueue& q = queues_[f.queue];
  if (q.next_send == q.sends.size()) return false;
  const size_t i = q.next_send++;
  f.out[0] = {&q.headers[i], sizeof(Header)};
  f.out[1] = {q.sends[i]->data, q.sends[i]->bytes};
  return true;
}

bool DirectExchange::next_receive(Flow& f) {
  PeerQueue& q = queues_[f.queue];
  if (q.next_receive == q.receives.size()) return false;
  const Message& m = *q.receives[q.next_receive++];
  expect(f, Header{static_cast<uint32_t>(Kind::kP2P), m.tag, m.bytes}, m.data, true);
  return true;
}

void DirectExchange::expect(Flow& f, const Header& h, void* into, bool alone) {
  f.in[0] = {headers_.data() + sizeof(Header) * f.peer, sizeof(Header)};
  f.in[1] = {into, into != nullptr ? h.bytes : 0};  // reset too: next_receive reuses a flow
  f.magic = h.magic;
  f.total = h.bytes;
  f.tag = h.tag;
  f.header_alone = alone;
}

DirectExchange::Flow DirectExchange::send_flow(int peer, const Header& mine, const void* data,
                                               const Header& ack) {
  Flow f;
  f.peer = peer;
  f.out[0] = {const_cast<Header*>(&mine), sizeof(Header)};
  f.out[1] = {const_cast<void*>(data), mine.bytes};
  expect(f, ack, nullptr, false);
  return f;
}

DirectExchange::Flow DirectExchange::receive_flow(int peer, const Header& mine, void* into,
                                                  const Header& ack) {
  Flow f;
  f.peer = peer;
  f.out[0] = {const_cast<Header*>(&ack), sizeof(Header)};
  expect(f, mine, into, true);
  return f;
}

DirectExchange::Flow DirectExchange::exchange_flow(int peer, const Header& mine, const void* data,
                                                   void* into, bool alone) {
  Flow f;
  f.peer = peer;
  f.out[0] = {const_cast<Header*>(&mine), sizeof(Header)};
  f.out[1] = {const_cast<void*>(data), mine.bytes};
  expect(f, mine, into, alone);
  return f;
}

}  // namespace tutti::gloo_backend
