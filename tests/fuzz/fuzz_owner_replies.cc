// What a consumer agent reads from an owner's connection (src/transfer/: the hello's reply, a
// stream's header and bytes, a publish's or a wait's reply and the publication it carries, a
// lease's reply), from an owner that is this harness: it listens on TCP as an agent of another host
// that does not exist, and the refs it hands the consumer (made by a real agent, then renamed to
// it) lead there. (Another host: a broken connection to an owner on this one is followed by a 100
// ms look at whether its process exited, which would make every input take that long.)
//
// Per input: the first byte picks the ref (an object streamed over "socket", a reserved one, one
// the consumer asks the owner to publish for its host, one it leases, or a reserved one it waits
// for, then leases: see Fake) and whether the owner's hello replies are proper ones (this harness's
// identity, protocol 3) or made from the input; then the input's bytes become frames (a type byte,
// a payload) or raw bytes on each connection the get makes, which is then closed. The get must end,
// with its data or a tutti::Error, within its timeout and a margin: never another exception, a
// crash or a hang.
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

struct World {
  std::shared_ptr<tutti::TransferAgent> real;      // makes the refs
  std::shared_ptr<tutti::TransferAgent> consumer;  // under test
  std::vector<float> data = std::vector<float>(16, 2.5f);
  tutti::ObjectHandle streamed, reserved, local, hop, reserved_hop;
  tutti::AgentIdentity fake;  // the owner the refs name: this harness
  tutti::TensorRef refs[5];   // streamed, reserved, fuzzlocal, fuzzhop, fuzzhop reserved
  int listener = -1;
};

tutti::TensorRef renamed(const tutti::TensorRef& r, const tutti::AgentIdentity& owner) {
  return tutti::TensorRef(owner, r.object(), r.transport(), r.tensors(), r.places(), r.blob(),
                          r.is_two_sided(), r.is_pending());
}

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

World& world() {
  static World* w = nullptr;
  if (w != nullptr) return *w;
  w = new World();
  ::setenv("TUTTI_LOG_LEVEL", "error", 0);  // not a warning per declined publish
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
  o.name = "fuzz-consumer";
  w->consumer = tutti::TransferAgent::create(o);
  tutti::PutOptions socket;
  socket.transport = "socket";
  w->streamed = w->real->put({tutti::TensorView(w->data)}, socket);
  w->reserved = w->real->reserve({{tutti::DType::kFloat32, {4}, tutti::Device::cpu()}}, socket);
  tutti::PutOptions local, hop;
  local.transport = "fuzzlocal";
  hop.transport = "fuzzhop";
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
  w->fake.uuid.fill(0xab);
  w->fake.host_key.fill(0xcd);  // another host
  w->fake.name = "fuzz-fake-owner";
  w->fake.tcp_endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  w->refs[0] = renamed(w->streamed.ref(), w->fake);
  w->refs[1] = renamed(w->reserved.ref(), w->fake);
  w->refs[2] = renamed(w->local.ref(), w->fake);
  w->refs[3] = renamed(w->hop.ref(), w->fake);
  w->refs[4] = renamed(w->reserved_hop.ref(), w->fake);
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

// The hello's reply an owner without a secret sends.
std::string proper_reply(const tutti::AgentIdentity& me) {
  const std::string id = tutti::detail::encode_identity(me);
  std::string p;
  u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  u32(p, tutti::detail::kProtocolVersion);
  p.push_back('\0');  // no proof
  return p;
}

// Reads one frame the consumer sent (its hello, then its request) without looking at it: the
// owner's side is fuzz_transfer_wire's. False when none came within a second.
bool skip_frame(int fd) {
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
  if (!read_exactly(reinterpret_cast<char*>(header), sizeof(header))) return false;
  const uint32_t length =
      header[0] | header[1] << 8 | header[2] << 16 | static_cast<uint32_t>(header[3]) << 24;
  return read_exactly(nullptr, length);
}

constexpr auto kGetTimeout = std::chrono::milliseconds(300);

// One connection of the consumer's: the owner's hello reply, then frames or raw bytes while the
// input lasts (a frame each, so that a later connection of the same get has some), then closed.
void serve(int fd, bool fuzzed_reply, const tutti::AgentIdentity& me, FuzzedDataProvider& in) {
  if (skip_frame(fd)) {  // the hello
    const std::string reply = fuzzed_reply ? in.ConsumeRandomLengthString(512) : proper_reply(me);
    tutti_fuzz::send_all(fd, frame(static_cast<uint8_t>(MsgType::kReply), reply));
    skip_frame(fd);  // the request (none after a reply it refused)
    const int frames = in.ConsumeIntegralInRange<int>(1, 4);
    for (int i = 0; i < frames && in.remaining_bytes() > 0; ++i) {
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
    ::shutdown(fd, SHUT_WR);
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = world();
  const int which = data[0] % 5;
  const bool fuzzed_reply = ((data[0] / 5) & 1) != 0;
  FuzzedDataProvider in(data + 1, size - 1);
  tutti::GetOptions opts;
  opts.timeout = kGetTimeout;
  opts.allow_fallback = which == 2;  // fuzzlocal from another host: ask for a publication
  // An owner of its own per input: a consumer asks an owner that declined a publish (or whose
  // reply did not parse) no more, and takes its socket stream instead.
  static uint64_t inputs = 0;
  ++inputs;
  tutti::AgentIdentity owner = w.fake;
  std::memcpy(owner.uuid.data(), &inputs, sizeof(inputs));
  const tutti::TensorRef ref = renamed(w.refs[which], owner);
  const auto start = std::chrono::steady_clock::now();
  tutti::Fetch f = w.consumer->get_async(ref, opts);
  // Every connection the get makes (a publish, then a lease, may take two), until it ends. A
  // connection pooled by an earlier get was closed by this side: the get may fail on it without
  // connecting again.
  while (!f.is_completed() && std::chrono::steady_clock::now() - start < std::chrono::seconds(2)) {
    if (tutti_fuzz::poll_one(w.listener, POLLIN, 1) != 1) continue;
    const int fd = ::accept4(w.listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) serve(fd, fuzzed_reply, owner, in);
  }
  try {
    const tutti::Received r = f.wait(std::chrono::milliseconds(5000));
    if (r.tensors().size() != 1) std::abort();
  } catch (const tutti::Error& e) {
    if (e.code() == tutti::ErrorCode::kTimeout &&
        std::string(e.what()).find("still runs") != std::string::npos) {
      std::abort();  // the get outlived its own timeout by seconds: a hang
    }
  }
  // Any other exception escapes to libFuzzer, which reports it.
  if (std::chrono::steady_clock::now() - start > std::chrono::seconds(6)) std::abort();
  return 0;
}
