// The agents' connections: framed request/reply messages over a stream socket (a Unix socket
// on one host, which can carry file descriptors, or TCP), with deadlines and cancellation
// (internal to the direct transport).
#pragma once

#include <openssl/ssl.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/deadline.h"

namespace tutti::detail {

using Clock = std::chrono::steady_clock;

// The agents' protocol, said in the hello and its reply: agents of different tutti builds whose
// messages differ refuse each other by name instead of misreading each other. Raise it with any
// change to a message's layout. 2: with a secret, the hello is a challenge and response. 3: a
// two-sided fetch is its transport's own call (kCall), no longer the agent's kFetch.
constexpr uint32_t kProtocolVersion = 3;
constexpr size_t kHelloNonceBytes = 16;  // each side's fresh nonce in a hello with a secret

// How long a consumer polls for its reply before it sleeps, and an owner's serving thread for
// the consumer's next request after an answer: an owner answers most calls within tens of
// microseconds, and a thread woken from poll(2) takes 20-90 us more on a VM (measured: a Unix
// socket's round trip took 8-96 us sleeping, 4 us polling). Bounded, and it yields the core to
// any thread that wants it meanwhile.
constexpr std::chrono::microseconds kReplySpin{200};

// A wait a request asks for travels as milliseconds: the consumer sends what is left until its
// deadline (at least 1 ms), the owner reads it back as a deadline; both cap it at a day.
constexpr uint64_t kMaxWireWaitMs = 86400000;
inline uint64_t wire_timeout(Clock::time_point deadline) {
  const auto left = static_cast<uint64_t>(std::max<int64_t>(1, time_left(deadline).count()));
  return std::min(left, kMaxWireWaitMs);
}
inline Clock::time_point wire_deadline(uint64_t ms) {
  return deadline_after(std::chrono::milliseconds(std::min(ms, kMaxWireWaitMs)));
}
// An owner's wait for what a consumer asked for within `ms`: it ends a little before the
// consumer gives up (a quarter of the time, at most 500 ms), so that the owner's answer, a refusal
// naming why at the latest, reaches the consumer rather than a closed connection.
inline Clock::time_point wire_answer_deadline(uint64_t ms) {
  const std::chrono::milliseconds timeout(std::min(ms, kMaxWireWaitMs));
  return wire_deadline(ms) -
         std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(500));
}

enum class MsgType : uint8_t {
  kHello = 1,  // consumer -> owner: who it is, its proof, its protocol version (+ its lease
               // lane); reply: who the owner is and its protocol version
  kCall,       // a transport's request to its owner side
  kWait,       // wait until a reserved object is fulfilled or failed
  kGot,        // a get of an object with expected gets completed
  kReleased,   // a lease on a retiring object ended: look again
  kStream,     // write the object's bytes to this connection
  kLease,      // (no lease lane) hold the object; kUnlease ends it
  kUnlease,
  kReply,
  kError,           // payload: code u8, message
  kChallenge = 12,  // (11 was protocol 2's kFetch) owner -> consumer, after a hello when the owner
                    // has a secret: the owner's nonce
  kProof,           // consumer -> owner: its proof of the secret over both agents and both nonces
  kPublish,  // consumer on another host -> owner: publish the object on this transport too (once
             // live); reply: its publication there
};

struct Message {
  MsgType type = MsgType::kReply;
  std::string payload;
  std::vector<int> fds;  // received descriptors: the receiver owns them
};

// One connected socket. Not thread-safe: one request at a time (the agents pool them).
class Connection {
 public:
  explicit Connection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Throws Error(kIoError) naming the peer when the connection breaks, kTimeout at the
  // deadline, kAborted once `cancelled` is set (checked every few tens of milliseconds).
  void send(MsgType type, std::string_view payload, const std::vector<int>& fds,
            Clock::time_point deadline, const std::atomic<bool>* cancelled = nullptr);
  // `spin`: how long to poll the socket without sleeping for the message's first byte, before
  // waiting in poll(2) (a reply expected within microseconds: waking a thread that slept costs
  // tens of microseconds on a VM).
  Message receive(Clock::time_point deadline, const std::atomic<bool>* cancelled = nullptr,
                  std::chrono::microseconds spin = std::chrono::microseconds(0));
  // As receive, for a server waiting for the next request: nothing when no byte of one came by
  // `idle_until` (the connection stays in step), else the whole message by `deadline`. A message
  // whose first bytes came is never given up at `idle_until`: its rest would be read as another.
  std::optional<Message> receive_next(Clock::time_point idle_until, Clock::time_point deadline,
                                      const std::atomic<bool>* cancelled,
                                      std::chrono::microseconds spin);
  void send_raw(std::vector<iovec> parts, Clock::time_point deadline,
                const std::atomic<bool>* cancelled = nullptr);
  void receive_raw(void* data, size_t bytes, Clock::time_point deadline,
                   const std::atomic<bool>* cancelled = nullptr);
  // TLS from here on (util/tls.h's context: `server` on the owner's side); the handshake must
  // finish by the deadline. Throws kInvalidArgument when TLS itself refuses (the other side does
  // not use TLS, or another secret), kIoError/kTimeout as the other calls. TCP connections only
  // (descriptors cannot travel in TLS).
  void start_tls(SSL_CTX* ctx, bool server, Clock::time_point deadline,
                 const std::atomic<bool>* cancelled = nullptr);
  bool tls() const { return ssl_ != nullptr; }
  // The first `bytes` waiting to be read, left there (fewer when only those came by the
  // deadline, or before the peer closed); throws like receive.
  std::string peek(size_t bytes, Clock::time_point deadline);
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  // The peer process's credentials (Unix sockets): pid and uid; -1 when unknown.
  long peer_pid() const;
  long peer_uid() const;

 private:
  // After a read that returned `n` < 1: throws kIoError for a closed connection or a failed
  // read, else waits until the socket is readable again.
  void await_readable(ssize_t n, Clock::time_point deadline, const std::atomic<bool>* cancelled);
  // Waits until the socket is ready for `events`; kIoError once a link to another host has
  // answered nothing for its bound (util/tcp_link.h).
  void wait_for(short events, Clock::time_point deadline, const std::atomic<bool>* cancelled,
                const char* doing);
  // Throws kIoError for a failed read or write (errno), naming a cut link as such.
  [[noreturn]] void failed(const std::string& doing) const;

  // Up to `bytes` of a message's first bytes from the socket (at least one), with the descriptors
  // sent along the first; how many came. Never more than the header, so never into the next
  // message (whose descriptors a read would take: the kernel ends a read after them).
  size_t receive_first(char* into, size_t bytes, std::vector<int>& fds, Clock::time_point deadline,
                       const std::atomic<bool>* cancelled, std::chrono::microseconds spin);
  // With TLS: one SSL_read/SSL_write, waiting (up to the deadline) while it wants the socket.
  size_t tls_io(bool write, void* data, size_t bytes, Clock::time_point deadline,
                const std::atomic<bool>* cancelled);

  int fd_;
  std::string peer_;
  SSL* ssl_ = nullptr;
};

// Whether a connection's first bytes (3) open a TLS handshake: a plain message never does (its
// length would be 16.8 MB or more).
bool looks_like_tls(const std::string& first);

// Throws kIoError: `what` and errno's text.
[[noreturn]] void io_error(const std::string& what);

// transfer/sockets.cc. Abstract Unix sockets (no file system entry; one namespace per network
// namespace).
int listen_unix(const std::string& name);
// Whether the other end of a connection hung up or reset it (one poll, no blocking).
bool hung_up(int fd);
// A full backlog (the owner is busy or stopped) is tried again until the deadline or `cancelled`.
int connect_unix(const std::string& name, Clock::time_point deadline,
                 const std::atomic<bool>* cancelled = nullptr);
// TCP; port 0 picks one (returned in `port`).
int listen_tcp(const std::string& host, uint16_t& port);
// A connect nobody answers (SYNs dropped) waits until the deadline, or `cancelled` (within 20 ms).
int connect_tcp(const std::string& host, uint16_t port, Clock::time_point deadline,
                const std::atomic<bool>* cancelled = nullptr);

}  // namespace tutti::detail
