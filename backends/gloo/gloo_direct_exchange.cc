#include "gloo_direct_exchange.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "gloo_store.h"
#include "tutti/error.h"
#include "tutti/prefix_store.h"

namespace tutti::gloo_backend {
namespace {

using Clock = std::chrono::steady_clock;

// What precedes each message's data. 16 bytes, so the data stays 16-byte aligned.
struct Header {
  uint32_t magic;
  uint32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16, "the header keeps the data aligned");
constexpr uint32_t kMagic = 0x74757474;  // "tutt"

// How long a wait polls before it sleeps. A round trip on loopback takes ~15 us and a peer
// that is late by a scheduling slice takes milliseconds: polling covers the first and gives up
// long before the second. Every turn yields the core, so polling costs a peer that shares the
// core little.
std::chrono::microseconds spin_budget() {
  static const std::chrono::microseconds budget = [] {
    const char* v = std::getenv("TUTTI_GLOO_SPIN_US");
    return std::chrono::microseconds(v != nullptr && *v != '\0' ? std::atol(v) : 200);
  }();
  return budget;
}

}  // namespace

DirectExchange::DirectExchange(int rank, int world_size,
                               const std::shared_ptr<tutti::Store>& store,
                               const std::shared_ptr<::gloo::transport::Device>& device,
                               std::chrono::milliseconds timeout)
    : rank_(rank), world_size_(world_size) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, world_size);
  context->setTimeout(timeout);
  GlooStore prefixed(std::make_shared<PrefixStore>("direct", store),
                     [this](int r, const std::vector<char>& addresses) {
                       connections_.record(r, addresses);
                     });
  auto shared_device = device;  // connectFullMesh takes a non-const reference
  context->connectFullMesh(prefixed, shared_device);
  context_ = std::move(context);
  connections_.find(rank_, world_size_);

  const int slot = context_->nextSlot();
  const size_t size = sizeof(Header) + kChunkBytes;
  outbox_.resize(size);
  inbox_.resize(world_size_);
  send_.resize(world_size_);
  recv_.resize(world_size_);
  for (int p = 0; p < world_size_; ++p) {
    if (p == rank_) continue;
    auto& pair = context_->getPair(p);
    pair->setSync(/*enable=*/true, /*busyPoll=*/false);  // this file polls, and gives way
    inbox_[p].resize(size);
    send_[p] = pair->createSendBuffer(slot, outbox_.data(), size);
    recv_[p] = pair->createRecvBuffer(slot, inbox_[p].data(), size);
  }
}

DirectExchange::~DirectExchange() {
  // Buffers before their pairs, pairs before the device (which the backend releases later).
  send_.clear();
  recv_.clear();
  context_.reset();
}

void DirectExchange::wait_readable(int peer, Clock::time_point deadline, const OpContext& ctx) {
  const int fd = connections_.socket_for(peer);
  if (fd < 0) return;  // Gloo's own blocking read waits instead (the context's timeout)
  const auto spin_end = Clock::now() + spin_budget();
  char byte;
  for (;;) {
    const ssize_t rv = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    // Data, the end of the stream or an error: Gloo's read takes it from here and reports.
    if (rv >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    if (Clock::now() >= spin_end) break;
    ::sched_yield();
  }
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      throw Error(ErrorCode::kTimeout, ctx.description() + ": timed out after " +
                                           std::to_string(ctx.timeout.count()) +
                                           " ms waiting for rank " + std::to_string(peer));
    }
    // Whole milliseconds, rounded up, and at most a minute per poll (deadlines can be far).
    const auto ms = std::min<int64_t>(
        60000, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1);
    pollfd p{fd, POLLIN, 0};
    const int rv = ::poll(&p, 1, static_cast<int>(ms));
    if (rv > 0) return;  // readable, closed or failed: Gloo's read tells which
    if (rv < 0 && errno != EINTR) return;
  }
}

void DirectExchange::exchange(const void* data, size_t bytes, uint64_t total,
                              Clock::time_point deadline, const OpContext& ctx) {
  const Header mine{kMagic, ctx.tag, total};
  std::memcpy(outbox_.data(), &mine, sizeof(mine));
  if (bytes > 0) std::memcpy(outbox_.data() + sizeof(Header), data, bytes);
  // Each write fits the socket's buffers (see the header comment), so none waits for a reader.
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ + k) % world_size_;
    send_[p]->send(0, sizeof(Header) + bytes);
    send_[p]->waitSend();
  }
  for (int k = 1; k < world_size_; ++k) {
    const int p = (rank_ - k + world_size_) % world_size_;  // the rank that sent to us first
    wait_readable(p, deadline, ctx);
    recv_[p]->waitRecv();
    Header theirs;
    std::memcpy(&theirs, inbox_[p].data(), sizeof(theirs));
    if (theirs.magic != kMagic || theirs.tag != mine.tag || theirs.bytes != mine.bytes) {
      throw Error(ErrorCode::kRemoteError,
                  ctx.description() + ": rank " + std::to_string(p) +
                      " called a different op or size (its message: " +
                      std::to_string(theirs.bytes) + " bytes, tag " + std::to_string(theirs.tag) +
                      "; this rank's: " + std::to_string(total) + " bytes, tag " +
                      std::to_string(mine.tag) +
                      "); every rank must make the same calls in the same order");
    }
  }
}

void DirectExchange::allreduce(void* data, size_t bytes, size_t element_size,
                               detail::ReduceFn fn, const OpContext& ctx) {
  const auto deadline = ctx.deadline();
  auto* out = static_cast<char*>(data);
  // Rank order on every rank, so all of them compute the same bits.
  auto block = [&](int r) -> const char* {
    return (r == rank_ ? outbox_.data() : inbox_[r].data()) + sizeof(Header);
  };
  for (size_t offset = 0; offset < bytes; offset += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, bytes - offset);
    exchange(out + offset, n, bytes, deadline, ctx);
    const size_t count = n / element_size;
    fn(out + offset, block(0), block(1), count);
    for (int r = 2; r < world_size_; ++r) fn(out + offset, out + offset, block(r), count);
  }
}

void DirectExchange::barrier(const OpContext& ctx) {
  exchange(nullptr, 0, 0, ctx.deadline(), ctx);
}

}  // namespace tutti::gloo_backend
