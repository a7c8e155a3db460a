// The direct transport's wire protocol, as an owner agent reads it from a consumer's connection
// (src/transfer/channel.h: frames of u32 length, u8 type, payload).
//
// Two owners for the whole run, one without a secret and one with, each holding a published
// object. Each input is one connection to one of them. The first byte picks: raw bytes from the
// start (the hello's framing and fields); or a proper hello (this process's identity, protocol
// 3, a nonce), then frames made from the input, each a type byte and a payload; a type with its
// high bit set gets the real object's id and generation put in front of its payload, so that
// requests reach the code behind the object lookups. The owner must answer or hang up, never
// crash, and keep serving: every so often a real consumer gets the object from it.
#include <fuzzer/FuzzedDataProvider.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_socket.h"
#include "tutti/transfer_agent.h"

namespace {

struct Owner {
  std::shared_ptr<tutti::TransferAgent> agent;
  std::vector<float> data = std::vector<float>(64, 1.5f);
  tutti::ObjectHandle handle;
  std::string address;
};

Owner& owner(bool with_secret) {
  static Owner* owners[2] = {nullptr, nullptr};
  Owner*& o = owners[with_secret ? 1 : 0];
  if (o == nullptr) {
    o = new Owner();
    tutti::TransferAgentOptions opts;
    opts.name = with_secret ? "fuzz-owner-secret" : "fuzz-owner";
    opts.secret = with_secret ? "s3cret" : "";
    opts.fetch_timeout = std::chrono::milliseconds(500);
    o->agent = tutti::TransferAgent::create(opts);
    o->handle = o->agent->put({tutti::TensorView(o->data)});
    o->address = "tutti-agent/" + o->agent->identity().uuid_text();
  }
  return *o;
}

void u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

int connect_abstract(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  tutti_fuzz::connect_or_die(fd, reinterpret_cast<sockaddr*>(&addr), len);
  return fd;
}

using tutti_fuzz::send_all;

std::string frame(uint8_t type, const std::string& payload) {
  std::string f;
  u32(f, static_cast<uint32_t>(payload.size() + 1));
  f.push_back(static_cast<char>(type));
  return f + payload;
}

// This process as a consumer says who it is (the owner checks the pid against the socket's).
std::string hello() {
  std::string id(16, '\x07');     // uuid
  id += std::string(16, '\x09');  // host key
  u32(id, static_cast<uint32_t>(::getpid()));
  id += std::string(8, '\0');  // start time
  id += std::string(1, '\0');  // no TCP endpoint
  id += std::string(1, '\x04') + "fuzz";
  std::string p;
  u32(p, static_cast<uint32_t>(id.size()));
  p += id;
  u32(p, 0);  // protocol 1's proof: empty
  u32(p, 3);  // protocol 3
  p += std::string(1, '\x10') + std::string(16, 'n');
  return p;
}

void drain(int fd) {
  char buf[4096];
  while (true) {
    if (tutti_fuzz::poll_one(fd, POLLIN, 200) != 1) return;
    if (tutti_fuzz::recv_some(fd, buf, sizeof(buf)) <= 0) return;
  }
}

void check_still_serving(Owner& o) {
  tutti::TransferAgentOptions opts;
  opts.name = "fuzz-consumer";
  opts.secret = o.agent == owner(true).agent ? "s3cret" : "";
  static std::shared_ptr<tutti::TransferAgent> consumers[2];
  auto& c = consumers[opts.secret.empty() ? 0 : 1];
  if (!c) c = tutti::TransferAgent::create(opts);
  const tutti::Received r = c->get(o.handle.ref());
  if (static_cast<const float*>(r.tensors()[0].data())[63] != 1.5f) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  Owner& o = owner((data[0] & 1) != 0);
  const bool raw = (data[0] & 2) != 0;
  const tutti::ObjectId object = o.handle.ref().object();
  FuzzedDataProvider in(data + 1, size - 1);
  const int fd = connect_abstract(o.address);
  if (raw) {
    send_all(fd, in.ConsumeRemainingBytesAsString());
  } else {
    send_all(fd, frame(1, hello()));
    while (in.remaining_bytes() > 0) {
      const uint8_t type = in.ConsumeIntegral<uint8_t>();
      std::string payload;
      if ((type & 0x80) != 0) {
        u64(payload, object.id);
        u32(payload, object.generation);
      }
      payload += in.ConsumeRandomLengthString(1024);
      send_all(fd, frame(static_cast<uint8_t>(type & 0x7f), payload));
    }
  }
  ::shutdown(fd, SHUT_WR);
  drain(fd);
  ::close(fd);
  static int count = 0;
  if (++count % 32 == 0) check_still_serving(o);
  return 0;
}
