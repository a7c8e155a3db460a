// What a consumer agent reads from an owner's connection (src/transfer/: the hello's reply, its
// challenge or error, a stream's header and bytes, a publish's or a wait's reply and the
// publication it carries, a lease's reply), from an owner that is this harness: it listens on TCP
// as an agent of another host that does not exist, and the refs it hands a real consumer (made by
// a real agent, then renamed to it) lead there. (Another host: a broken connection to an owner on
// this one is followed by a look of up to 100 ms at whether its process exited, which would make
// most inputs take that long.)
//
// Per input: the first byte picks the ref (an object streamed over "socket"; one the consumer
// asks the owner to publish for its host; one it leases; a reserved one it waits for, then
// leases: see Fake) and how the owner answers the hello (a proper reply, one whose tail after the
// identity comes from the input, or any frame from the input). Then, on each connection the get
// makes, each request the consumer sends is answered with frames or raw bytes from the input,
// until the input is used up; then the connection is closed. The get must end with its data or a
// tutti::Error: another exception (std::terminate, which libFuzzer reports), a crash, or a get
// still running seconds past its timeout of 100 ms is a finding. Thread timing decides part of
// the path (which request a frame meets), so an input may need a few replays to repeat a finding.
#include <arpa/inet.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_socket.h"
#include "transfer/channel.h"
#include "transfer/handshake.h"
#include "tutti/error.h"
#include "tutti/tensor_transport.h"
#include "tutti/transfer_agent.h"

namespace {

using tutti::detail::MsgType;

// One-sided transports of this harness's: "fuzzhop" reaches agents on any host, as the ucx
// plugin does ("across hosts"); "fuzzlocal" only agents on its own host, as shm does (which the
// fuzzers do not link). A consumer on another host leases a fuzzhop object and fetches it; for a
// fuzzlocal one it first asks the owner to publish it on fuzzhop too (kPublish). Their fetch
// leaves the targets as they are.
class Fake final : public tutti::TensorTransport {
 public:
  explicit Fake(bool cross_host) : cross_host_(cross_host) {}
  const char* name() const override { return cross_host_ ? "fuzzhop" : "fuzzlocal"; }
  tutti::TransportTraits traits() const override {
    tutti::TransportTraits t;
    t.cross_host = cross_host_;
    return t;
  }
  tutti::Publication publish(const tutti::PublishRequest&) override { return {}; }
  tutti::FetchResult fetch(const tutti::FetchRequest&) override { return {}; }

 private:
  const bool cross_host_;
};

struct World {
  std::shared_ptr<tutti::TransferAgent> real;      // makes the refs
  std::shared_ptr<tutti::TransferAgent> consumer;  // under test
  std::vector<float> data = std::vector<float>(16, 2.5f);
  tutti::ObjectHandle streamed, local, hop, reserved_hop;
  tutti::AgentIdentity fake;  // the owner the refs name: this harness
  tutti::TensorRef refs[4];   // streamed, fuzzlocal, fuzzhop, fuzzhop reserved
  int listener = -1;
  uint64_t inputs = 0;
};

tutti::TensorRef renamed(const tutti::TensorRef& r, const tutti::AgentIdentity& owner) {
  return tutti::TensorRef(owner, r.object(), r.transport(), r.tensors(), r.places(), r.blob(),
                          r.is_two_sided(), r.is_pending());
}

std::shared_ptr<tutti::TransferAgent> make_consumer() {
  tutti::TransferAgentOptions o;
  o.name = "fuzz-consumer";
  return tutti::TransferAgent::create(o);
}

World& world() {
  static World* w = nullptr;
  if (w != nullptr) return *w;
  w = new World();
  ::setenv("TUTTI_LOG_LEVEL", "error", 0);  // not a warning per declined publish
  // The paths this harness takes, whatever the environment says: no secret (the renamed refs
  // are unsigned), no TLS, "auto" across hosts, no plugins.
  for (const char* v : {"TUTTI_TRANSFER_SECRET", "TUTTI_STORE_SECRET", "TUTTI_TRANSFER_TLS",
                        "TUTTI_TRANSFER_ACROSS_HOSTS", "TUTTI_PLUGINS"}) {
    ::unsetenv(v);
  }
  for (const bool cross_host : {true, false}) {
    tutti::TransportInfo info;
    info.name = cross_host ? "fuzzhop" : "fuzzlocal";
    info.factory = [cross_host](const tutti::TransportContext&) {
      return std::make_unique<Fake>(cross_host);
    };
    info.priority = -1;
    info.across_hosts = cross_host;
    tutti::register_tensor_transport(std::move(info));
  }
  tutti::TransferAgentOptions o;
  o.name = "fuzz-real-owner";
  w->real = tutti::TransferAgent::create(o);
  w->consumer = make_consumer();
  tutti::PutOptions socket, local, hop;
  socket.transport = "socket";
  local.transport = "fuzzlocal";
  hop.transport = "fuzzhop";
  w->streamed = w->real->put({tutti::TensorView(w->data)}, socket);
  w->local = w->real->put({tutti::TensorView(w->data)}, local);
  w->hop = w->real->put({tutti::TensorView(w->data)}, hop);
  w->reserved_hop = w->real->reserve({{tutti::DType::kFloat32, {4}, tutti::Device::cpu()}}, hop);
  w->listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(w->listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(w->listener, 16) != 0 ||
      ::getsockname(w->listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::abort();
  }
  w->fake = w->real->identity();
  w->fake.uuid.fill(0xab);      // (its first 8 bytes: the input's number)
  w->fake.host_key.fill(0xcd);  // another host
  w->fake.name = "fuzz-fake-owner";
  w->fake.tcp_endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  w->refs[0] = renamed(w->streamed.ref(), w->fake);
  w->refs[1] = renamed(w->local.ref(), w->fake);
  w->refs[2] = renamed(w->hop.ref(), w->fake);
  w->refs[3] = renamed(w->reserved_hop.ref(), w->fake);
  return *w;
}

void u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string frame(uint8_t type, const std::string& payload) {
  std::string f;
  u32(f, static_cast<uint32_t>(payload.size() + 1));
  f.push_back(static_cast<char>(type));
  return f + payload;
}

// The hello's reply of an owner without a secret: its identity, then (`tail` when given) the
// protocol version and an empty proof.
std::string hello_reply(const tutti::AgentIdentity& me, const std::string* tail) {
  const std::string id = tutti::detail::encode_identity(me);
  std::string p;
  u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  if (tail != nullptr) return p + *tail;
  u32(p, tutti::detail::kProtocolVersion);
  p.push_back('\0');  // no proof
  return p;
}

enum class Read { kFrame, kNothing, kClosed };

// Reads one frame the consumer sent (its hello, a request) without looking at it: the owner's
// side is fuzz_transfer_wire's. kNothing when none began within `wait_ms`.
Read skip_frame(int fd, int wait_ms) {
  if (tutti_fuzz::poll_one(fd, POLLIN, wait_ms) != 1) return Read::kNothing;
  auto read_exactly = [&](char* out, size_t n) {
    char buf[4096];
    while (n > 0) {
      if (tutti_fuzz::poll_one(fd, POLLIN, 1000) != 1) return false;
      const size_t want = std::min(n, sizeof(buf));
      const ssize_t got = tutti_fuzz::recv_some(fd, out != nullptr ? out : buf, want);
      if (got <= 0) return false;
      if (out != nullptr) out += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  uint8_t header[4];
  if (!read_exactly(reinterpret_cast<char*>(header), sizeof(header))) return Read::kClosed;
  const uint32_t length =
      header[0] | header[1] << 8 | header[2] << 16 | static_cast<uint32_t>(header[3]) << 24;
  return read_exactly(nullptr, length) ? Read::kFrame : Read::kClosed;
}

// A frame or raw bytes from the input.
void send_some(int fd, FuzzedDataProvider& in) {
  const uint8_t pick = in.ConsumeIntegral<uint8_t>();
  const std::string bytes = in.ConsumeRandomLengthString(1024);
  if (pick < 64) {
    tutti_fuzz::send_all(fd, bytes);  // raw: a stream's tensor bytes, or junk
  } else if (pick < 192) {
    tutti_fuzz::send_all(fd, frame(static_cast<uint8_t>(MsgType::kReply), bytes));
  } else if (pick < 224) {
    tutti_fuzz::send_all(fd, frame(static_cast<uint8_t>(MsgType::kError), bytes));
  } else {
    tutti_fuzz::send_all(fd, frame(static_cast<uint8_t>(pick - 224), bytes));
  }
}

// One connection of the consumer's: the hello answered (`hello_mode`), then a few frames for
// each request, and for what follows one (a stream's bytes), while the input lasts.
void serve(int fd, int hello_mode, const tutti::AgentIdentity& me, FuzzedDataProvider& in) {
  if (skip_frame(fd, 1000) == Read::kFrame) {
    if (hello_mode == 0) {
      tutti_fuzz::send_all(fd,
                           frame(static_cast<uint8_t>(MsgType::kReply), hello_reply(me, nullptr)));
    } else if (hello_mode == 1) {
      const std::string tail = in.ConsumeRandomLengthString(64);
      tutti_fuzz::send_all(fd,
                           frame(static_cast<uint8_t>(MsgType::kReply), hello_reply(me, &tail)));
    } else {
      send_some(fd, in);  // a challenge, an error, anything
    }
    for (int wait_ms = 1000; in.remaining_bytes() > 0; wait_ms = 0) {
      if (skip_frame(fd, wait_ms) == Read::kClosed) break;
      const int frames = in.ConsumeIntegralInRange<int>(1, 3);
      for (int i = 0; i < frames && in.remaining_bytes() > 0; ++i) send_some(fd, in);
    }
    ::shutdown(fd, SHUT_WR);
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = world();
  const int which = data[0] % 4;
  const int hello_mode = (data[0] / 4) % 3;
  FuzzedDataProvider in(data + 1, size - 1);
  // An owner of its own per input: a consumer asks an owner that declined a publish (or whose
  // reply did not parse) no more, and takes its socket stream instead. A fresh consumer every 256
  // inputs: it keeps a peer per owner it met.
  if (++w.inputs % 256 == 0) w.consumer = make_consumer();
  tutti::AgentIdentity owner = w.fake;
  std::memcpy(owner.uuid.data(), &w.inputs, sizeof(w.inputs));
  const tutti::TensorRef ref = renamed(w.refs[which], owner);
  tutti::GetOptions opts;
  opts.timeout = std::chrono::milliseconds(100);
  opts.allow_fallback = which == 1;  // fuzzlocal from another host: ask for a publication
  const auto start = std::chrono::steady_clock::now();
  tutti::Fetch f = w.consumer->get_async(ref, opts);
  // Every connection the get makes, until it ends.
  while (!f.is_completed() && std::chrono::steady_clock::now() - start < std::chrono::seconds(2)) {
    if (tutti_fuzz::poll_one(w.listener, POLLIN, 1) != 1) continue;
    const int fd = ::accept4(w.listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) serve(fd, hello_mode, owner, in);
  }
  try {
    const tutti::Received r = f.wait(std::chrono::milliseconds(5000));
    if (r.tensors().size() != 1) std::abort();
  } catch (const tutti::Error&) {
    // Its own error, or the owner's words passed on (a fuzzed kError frame may carry any code
    // and text): either way the get ended, unless the wait gave up on it.
  }
  if (!f.is_completed()) std::abort();  // still running 5 s after its 100 ms timeout: a hang
  return 0;
}
