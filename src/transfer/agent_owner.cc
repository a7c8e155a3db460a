// The owner's side of a TransferAgent: identity, the object table and its lifetime, and the
// connections consumers make to it.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transfer/agent_core.h"
#include "transfer/group_transport.h"
#include "transfer/wire.h"
#include "util/tls.h"
#include "util/deadline.h"
#include "util/fork_watch.h"
#include "util/host_identity.h"
#include "util/logging.h"
#include "util/crypto.h"

namespace tutti::detail {
namespace {

uint64_t namespace_inode(const char* which) {
  struct stat st;
  const std::string path = std::string("/proc/self/ns/") + which;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

std::chrono::milliseconds env_timeout() {
  if (const char* v = std::getenv("TUTTI_RDT_FETCH_TIMEOUT_MS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long long ms = std::strtoll(v, &end, 10);
    if (*end == '\0' && ms > 0) return std::chrono::milliseconds(ms);
  }
  return std::chrono::milliseconds(60000);
}

// The address to listen on and publish when TransferAgentOptions::tcp_host is empty: the host
// name when it resolves to an address other hosts can reach, else the first such interface
// address (Debian maps the host name to 127.0.1.1), else loopback.
std::string default_tcp_host() {
  char name[256] = {0};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* info = nullptr;
  if (::gethostname(name, sizeof(name) - 1) == 0 && ::getaddrinfo(name, nullptr, &hints, &info) == 0) {
    bool loopback = true;
    for (addrinfo* a = info; a != nullptr; a = a->ai_next) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) loopback = false;
    }
    ::freeaddrinfo(info);
    if (!loopback) return name;
  }
  ifaddrs* ifs = nullptr;
  std::string found;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      char text[INET_ADDRSTRLEN] = {0};
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
    }
    ::freeifaddrs(ifs);
  }
  return found.empty() ? "127.0.0.1" : found;
}

std::string seconds_ago(Clock::time_point t) {
  const double s = std::chrono::duration<double>(Clock::now() - t).count();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

// A consumer's timeout off the wire as a deadline: at most a day.
// A deadline a peer asked for, in milliseconds from now: at most a day.
Clock::time_point wire_deadline(uint64_t ms) {
  return deadline_after(std::chrono::milliseconds(std::min<uint64_t>(ms, 86400000)));
}

// Whether the other end of a connection hung up (one poll, no blocking).
bool hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Throws unless the object can be served now: kTimeout while still reserved, kRemoteError once
// failed (its message), kInvalidUsage while being freed.
void require_live(const Object& o) {
  if (o.state == kSlotReserved) {
    throw Error(ErrorCode::kTimeout,
                "object " + std::to_string(o.id) + " is still reserved (never fulfilled)");
  }
  if (o.state == kSlotFailed) throw Error(ErrorCode::kRemoteError, "the owner failed it: " + o.failure);
  if (o.state != kSlotLive) {
    throw Error(ErrorCode::kInvalidUsage,
                "object " + std::to_string(o.id) + " is being freed at its owner");
  }
}

// The publication of a live object, as a WAIT reply carries it.
void write_publication(WireWriter& w, const Publication& p, size_t tensors) {
  w.str32(p.blob);
  w.u32(static_cast<uint32_t>(tensors));
  for (size_t i = 0; i < tensors; ++i) {
    const auto place = i < p.places.size() ? p.places[i] : std::pair<uint16_t, uint64_t>{0, 0};
    w.u16(place.first);
    w.u64(place.second);
  }
}

}  // namespace

std::vector<TensorView> snapshot_copy(TensorTransport& t, const std::vector<TensorView>& tensors,
                                      std::vector<std::shared_ptr<void>>& storage) {
  std::vector<TensorView> out;
  for (const TensorView& src : tensors) {
    TensorView copy;
    try {
      copy = t.allocate(std::max<size_t>(src.nbytes(), 1), DType::kUInt8);
      TensorTransport* owner = &t;
      storage.emplace_back(copy.data(), [owner, copy](void*) { owner->deallocate(copy); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnavailable) throw;
      storage.push_back(allocate_bytes(src.nbytes()));
      copy = TensorView(storage.back().get(), DType::kUInt8,
                        {static_cast<int64_t>(std::max<size_t>(src.nbytes(), 1))});
    }
    if (src.nbytes() > 0) std::memcpy(copy.data(), src.data(), src.nbytes());
    out.emplace_back(copy.data(), src.dtype(), src.shape(), src.device());
  }
  return out;
}

// PutOptions::check_writes: a CRC32C per CPU tensor.
std::vector<uint32_t> checksums(const std::vector<TensorView>& tensors) {
  std::vector<uint32_t> out;
  for (const TensorView& t : tensors) {
    out.push_back(t.device().type == DeviceType::kCPU && t.nbytes() > 0
                      ? crc32c(std::string_view(static_cast<const char*>(t.data()), t.nbytes()))
                      : 0);
  }
  return out;
}

std::shared_ptr<void> allocate_bytes(size_t bytes) {
  void* p = nullptr;
  try {
    p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kUnavailable,
                "cannot allocate " + std::to_string(bytes) + " bytes to receive into");
  }
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, std::align_val_t(64)); });
}

ObjectPin::~ObjectPin() {
  if (auto c = core.lock()) c->drop_pin(id);
}

std::string error_payload(const Error& e) {
  WireWriter w;
  w.u8(static_cast<uint8_t>(e.code()));
  w.str32(e.what());
  return std::move(w.out());
}

void throw_error_payload(const std::string& payload) {
  WireReader r(payload, "an agent's error");
  const uint8_t code = r.u8("code");
  const std::string what = r.str32("message", 1u << 20);
  throw Error(code <= static_cast<uint8_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code)
                                                                  : ErrorCode::kInternal,
              what);
}

std::string AgentCore::encode_identity(const AgentIdentity& id) {
  WireWriter w;
  w.bytes(id.uuid.data(), 16);
  w.bytes(id.host_key.data(), 16);
  w.u32(id.pid);
  w.u64(id.start_time);
  w.str8(id.tcp_endpoint);
  w.str8(id.name);
  return std::move(w.out());
}

AgentIdentity AgentCore::decode_identity(const std::string& bytes) {
  WireReader r(bytes, "an agent's identity");
  AgentIdentity id;
  r.bytes(id.uuid.data(), 16, "id");
  r.bytes(id.host_key.data(), 16, "host key");
  id.pid = r.u32("pid");
  id.start_time = r.u64("start time");
  id.tcp_endpoint = r.str8("endpoint");
  id.name = r.str8("name");
  return id;
}

std::string AgentCore::hello_proof(const std::string& secret, const char* role,
                                   const AgentIdentity& owner, const AgentIdentity& consumer,
                                   const std::string& owner_nonce,
                                   const std::string& consumer_nonce) {
  WireWriter w;
  w.str8(std::string("tutti-rdt-hello/") + role);
  w.str8(owner.uuid_text());
  w.str8(consumer.uuid_text());
  w.str8(owner_nonce);
  w.str8(consumer_nonce);
  const auto mac = hmac_sha256(secret, w.out());
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

AgentCore::AgentCore(const TransferAgentOptions& opts) : options(opts), fork_gen(fork_generation()) {
  const std::string id = random_bytes(identity.uuid.size());
  std::memcpy(identity.uuid.data(), id.data(), id.size());
  const std::string where = host_identity() + "/" + std::to_string(namespace_inode("net")) + "/" +
                            std::to_string(namespace_inode("pid"));
  const auto digest = sha256(where);
  std::copy(digest.begin(), digest.begin() + 16, identity.host_key.begin());
  identity.pid = static_cast<uint32_t>(::getpid());
  identity.start_time = process_start_time(static_cast<long>(identity.pid));
  if (options.name.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    options.name = std::string(host) + ":" + std::to_string(identity.pid);
  }
  identity.name = options.name;
  if (options.secret.empty()) {
    if (const char* s = std::getenv("TUTTI_STORE_SECRET")) options.secret = s;
  }
  fetch_timeout = options.fetch_timeout.count() > 0 ? options.fetch_timeout : env_timeout();
  if (!options.tls) options.tls = tls_from_env("TUTTI_TRANSFER_TLS");
  if (options.tls) {
    if (options.secret.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  who() + ": TLS (TransferAgentOptions::tls, TUTTI_TRANSFER_TLS) needs a secret, "
                          "which keys it: set TransferAgentOptions::secret or TUTTI_STORE_SECRET");
    }
    tls_server = make_psk_context(/*server=*/true, options.secret, "tutti transfer");
    tls_client = make_psk_context(/*server=*/false, options.secret, "tutti transfer");
  }
  if (const char* v = std::getenv("TUTTI_RDT_CHECK")) check_writes_env = std::string(v) == "1";
}

std::string AgentCore::who() const { return "agent '" + identity.name + "'"; }

bool AgentCore::forked() const { return fork_gen != fork_generation(); }

void AgentCore::check_process(const char* op) const {
  if (forked()) {
    throw Error(ErrorCode::kInvalidUsage,
                std::string(op) + " on " + who() + ": the agent belongs to the parent process (pid " +
                    std::to_string(identity.pid) + "); a forked child makes its own agent");
  }
}

void AgentCore::start() {
  // Both listeners first: a failure leaves no thread behind.
  unix_listener = listen_unix("tutti-agent/" + identity.uuid_text());
  if (options.listen_tcp) {
    const std::string host = options.tcp_host.empty() ? default_tcp_host() : options.tcp_host;
    uint16_t port = 0;
    try {
      tcp_listener = listen_tcp(host, port);
    } catch (...) {
      ::close(unix_listener);
      unix_listener = -1;
      throw;
    }
    identity.tcp_endpoint = host + ":" + std::to_string(port);
  }
  acceptors.emplace_back([this] { accept_loop(unix_listener, true); });
  if (tcp_listener >= 0) acceptors.emplace_back([this] { accept_loop(tcp_listener, false); });
  housekeeper = std::thread([this] { housekeeping_loop(); });
  TUTTI_LOG_DEBUG("direct transport: {} listening on @tutti-agent/{}{}", who(),
                  identity.uuid_text(),
                  identity.tcp_endpoint.empty() ? "" : " and " + identity.tcp_endpoint);
}

void AgentCore::stop() {
  if (stopping.exchange(true)) return;
  if (forked()) {
    // The threads are the parent's, the objects too: leave all of it (the child's copy of the
    // memory goes with the child).
    new std::vector<std::thread>(std::move(acceptors));  // never joined, never destroyed here
    new std::thread(std::move(housekeeper));
    return;
  }
  abort_gets();
  for (int fd : {unix_listener, tcp_listener}) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : acceptors) t.join();
  for (int fd : {unix_listener, tcp_listener}) {
    if (fd >= 0) ::close(fd);
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    for (int fd : serving_fds) ::shutdown(fd, SHUT_RDWR);
    changed.notify_all();
    serving_done.wait_for(lock, std::chrono::seconds(5), [&] { return serving_threads == 0; });
  }
  if (housekeeper.joinable()) housekeeper.join();
  {
    // The two-sided transports' threads and groups end now, not whenever the last reference to
    // the agent goes (a completion callback may hold one a moment longer). Transports live as
    // long as the agent: the pointers stay good outside the lock.
    std::vector<GroupTransport*> two_sided;
    {
      std::lock_guard<std::mutex> lock(transports_mutex);
      for (auto& [name, t] : transports) {
        if (auto* g = dynamic_cast<GroupTransport*>(t.get())) two_sided.push_back(g);
      }
    }
    for (GroupTransport* g : two_sided) g->shutdown();
  }
  {
    // Whatever is still published goes with the agent (consumers' mappings stay readable).
    std::lock_guard<std::mutex> lock(mutex);
    while (!objects.empty()) free_locked(objects.begin());
  }
  std::lock_guard<std::mutex> lock(peers_mutex);
  peers.clear();
}

std::string AgentCore::resolve_transport(const std::string& requested) const {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "auto") return is_registered_tensor_transport("shm") ? "shm" : "socket";
  return name;
}

ObjectHandle AgentCore::publish(const std::vector<TensorView>& tensors,
                                const std::vector<TensorMeta>& metas, const PutOptions& opts,
                                bool reserved) {
  const std::string name = resolve_transport(opts.transport);
  TensorTransport& t = transport(name);
  const bool cuda = t.traits().cuda;
  for (size_t i = 0; i < metas.size(); ++i) {
    if ((metas[i].device.type == DeviceType::kCUDA) != cuda) {
      throw Error(ErrorCode::kInvalidArgument,
                  (reserved ? "reserve on " : "put on ") + who() + ": tensor " + std::to_string(i) +
                      " is on " + metas[i].device.str() + "; transport '" + name + "' carries " +
                      (cuda ? "CUDA" : "CPU") + " tensors");
    }
  }
  auto* group = dynamic_cast<GroupTransport*>(&t);
  uint64_t id;
  uint32_t slot, generation;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping) throw Error(ErrorCode::kInvalidUsage, "put on " + who() + ": the agent is gone");
    if (!free_slots.empty()) {
      slot = free_slots.back();
      free_slots.pop_back();
    } else if (next_slot < SlotPage::kCapacity) {
      slot = next_slot++;
    } else {
      throw Error(ErrorCode::kUnavailable,
                  "put on " + who() + ": " + std::to_string(SlotPage::kCapacity) +
                      " objects are live; release some handles first");
    }
    id = next_id++;
    generation = slots.slot(slot).generation.load() + 1;
    slots.slot(slot).generation.store(generation);
    Object& o = objects[id];
    o.id = id;
    o.slot = slot;
    o.generation = generation;
    o.metas = metas;
    o.transport = name;
    o.t = &t;
    o.expected_gets = opts.expected_gets;
    o.keep_for = opts.keep_for;
    o.check_writes = opts.check_writes || check_writes_env;
    o.handles = 1;  // the pin made below: nothing frees it meanwhile
  }
  Publication pub;
  std::vector<TensorView> published = tensors;
  std::vector<std::shared_ptr<void>> storage;
  if (!reserved || group != nullptr) {
    try {
      if (opts.snapshot && !reserved) published = snapshot_copy(t, tensors, storage);
      // A two-sided ref names its group even before the data exists.
      pub = t.publish(PublishRequest{ObjectId{id, generation, slot}, published, opts.stream});
      if (pub.blob.size() > TensorRef::kMaxBlob) {
        t.unpublish(ObjectId{id, generation, slot});
        throw Error(ErrorCode::kInvalidArgument,
                    "put on " + who() + ": transport '" + name + "' describes these " +
                        std::to_string(tensors.size()) + " tensors in " +
                        std::to_string(pub.blob.size()) + " bytes, a ref holds at most " +
                        std::to_string(TensorRef::kMaxBlob) + " (put fewer tensors per object)");
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      objects.erase(id);
      free_slots.push_back(slot);
      throw;
    }
  }
  TensorRef ref(identity, ObjectId{id, generation, slot}, name, metas, pub.places, pub.blob,
                !t.traits().one_sided && name != "socket", reserved);
  if (!options.secret.empty()) ref.sign(options.secret);
  {
    std::lock_guard<std::mutex> lock(mutex);
    Object& o = objects.at(id);
    o.ref = ref;
    o.publication = pub;
    o.published = !reserved;
    o.snapshot = opts.snapshot;
    if (!reserved) {
      o.tensors = std::move(published);
      o.storage = std::move(storage);
      if (o.check_writes) o.crcs = checksums(o.tensors);
    }
    o.state = reserved ? kSlotReserved : kSlotLive;
    Slot& s = slots.slot(slot);
    s.flags.store(opts.expected_gets > 0 ? kSlotCountsGets : 0);
    s.state.store(o.state);
  }
  auto pin = std::make_shared<ObjectPin>();
  pin->core = weak_from_this();
  pin->id = id;
  pin->ref = ref;
  return ObjectHandle(std::move(pin));
}

void AgentCore::fulfil(uint64_t id, const std::vector<TensorView>& tensors) {
  Object* o = nullptr;
  std::string name;
  uint32_t generation, slot;
  bool snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = objects.find(id);
    if (it == objects.end() || it->second.state != kSlotReserved || it->second.fulfilling) {
      throw Error(ErrorCode::kInvalidUsage,
                  "fulfil on " + who() + ": object " + std::to_string(id) +
                      (it == objects.end() ? " is gone"
                       : it->second.fulfilling ? " is being fulfilled by another call"
                                               : " is not reserved (fulfilled or failed)"));
    }
    o = &it->second;
    if (tensors.size() != o->metas.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "fulfil on " + who() + ": object " + std::to_string(id) + " has " +
                      std::to_string(o->metas.size()) + " tensors, got " +
                      std::to_string(tensors.size()));
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorMeta& m = o->metas[i];
      if (tensors[i].dtype() != m.dtype || tensors[i].shape() != m.shape ||
          tensors[i].device() != m.device) {
        throw Error(ErrorCode::kInvalidArgument,
                    "fulfil on " + who() + ": tensor " + std::to_string(i) + " is " +
                        tensors[i].str() + ", object " + std::to_string(id) + " reserved " + m.str());
      }
    }
    name = o->transport;
    generation = o->generation;
    slot = o->slot;
    snapshot = o->snapshot;
    o->fulfilling = true;  // one fulfil at a time: a second one is refused above
  }
  TensorTransport& t = transport(name);
  std::vector<std::shared_ptr<void>> storage;
  std::vector<TensorView> published;
  Publication pub;
  try {
    published = snapshot ? snapshot_copy(t, tensors, storage) : tensors;
    pub = t.publish(PublishRequest{ObjectId{id, generation, slot}, published});
    if (pub.blob.size() > TensorRef::kMaxBlob) {
      t.unpublish(ObjectId{id, generation, slot});
      throw Error(ErrorCode::kInvalidArgument,
                  "fulfil on " + who() + ": transport '" + name + "' describes these tensors in " +
                      std::to_string(pub.blob.size()) + " bytes, a ref holds at most " +
                      std::to_string(TensorRef::kMaxBlob));
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = objects.find(id);
    if (it != objects.end()) it->second.fulfilling = false;
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end() || it->second.state != kSlotReserved) {
    t.unpublish(ObjectId{id, generation, slot});
    throw Error(ErrorCode::kInvalidUsage,
                "fulfil on " + who() + ": object " + std::to_string(id) + " went meanwhile");
  }
  it->second.fulfilling = false;
  it->second.publication = pub;
  it->second.published = true;
  it->second.tensors = published;
  if (it->second.check_writes) it->second.crcs = checksums(published);
  it->second.storage = std::move(storage);
  it->second.state = kSlotLive;
  slots.slot(it->second.slot).state.store(kSlotLive);
  changed.notify_all();
}

void AgentCore::fail(uint64_t id, std::string_view message) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end()) {
    throw Error(ErrorCode::kInvalidUsage,
                "fail on " + who() + ": object " + std::to_string(id) + " is gone");
  }
  Object& o = it->second;
  if (o.state == kSlotRetiring) return;
  o.failure = std::string(message);
  o.state = kSlotFailed;
  slots.slot(o.slot).state.store(kSlotFailed);
  changed.notify_all();
}

void AgentCore::drop_pin(uint64_t id) {
  if (forked()) return;  // the parent's object
  std::lock_guard<std::mutex> lock(mutex);
  auto it = objects.find(id);
  if (it == objects.end()) return;
  Object& o = it->second;
  if (--o.handles > 0) return;
  o.keep_until = Clock::now() + o.keep_for;
  settle_locked(o);
  changed.notify_all();  // the housekeeper may have a keep_for deadline to watch
}

bool AgentCore::leased_by_a_lane_locked(const Object& o, std::string* holder) const {
  for (const auto& [uuid, c] : consumers) {
    if (c->lane && c->lane->holds(o.slot, o.generation)) {
      if (holder != nullptr) {
        *holder = "agent '" + c->identity.name + "' (pid " + std::to_string(c->identity.pid) + ")";
      }
      return true;
    }
  }
  return false;
}

void AgentCore::settle_locked(Object& o) {
  if (o.state != kSlotRetiring && o.handles == 0 && o.expected_gets == 0 &&
      Clock::now() >= o.keep_until) {
    o.state = kSlotRetiring;
    slots.slot(o.slot).state.store(kSlotRetiring);  // seq_cst: then look at the lanes
    changed.notify_all();
  }
  if (o.state == kSlotRetiring && o.local_leases == 0 && !leased_by_a_lane_locked(o)) {
    free_locked(objects.find(o.id));
  }
}

void AgentCore::settle_all_locked() {
  std::vector<uint64_t> ids;
  for (const auto& [id, o] : objects) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = objects.find(id);
    if (it != objects.end()) settle_locked(it->second);
  }
}

void AgentCore::free_locked(std::map<uint64_t, Object>::iterator it) {
  Object& o = it->second;
  if (o.check_writes && !o.crcs.empty() && checksums(o.tensors) != o.crcs) {
    const std::vector<uint32_t> now = checksums(o.tensors);
    std::string which;
    for (size_t i = 0; i < now.size(); ++i) {
      if (now[i] != o.crcs[i]) which += (which.empty() ? "" : ", ") + std::to_string(i);
    }
    WriteViolation v;
    v.tensors = o.tensors;
    v.text = "object " + std::to_string(o.id) + " (" + o.transport + ") changed after put: tensor(s) " +
             which + " were written while published; call wait_tensor_freed before writing";
    TUTTI_LOG_ERROR("direct transport: {}: {}", who(), v.text);
    violations.push_back(std::move(v));
    if (violations.size() > 1024) violations.pop_front();
  }
  if (o.published) o.t->unpublish(ObjectId{o.id, o.generation, o.slot});
  slots.slot(o.slot).state.store(kSlotFree);
  free_slots.push_back(o.slot);
  freed.emplace_back(o.id, Clock::now());
  if (freed.size() > 4096) freed.pop_front();
  objects.erase(it);
  changed.notify_all();
}

std::string AgentCore::freed_text_locked(uint64_t id) const {
  for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
    if (it->first == id) return "was freed " + seconds_ago(it->second) + " ago";
  }
  return id < next_id ? "was freed" : "was never published by this agent";
}

std::string AgentCore::blockers_locked(const Object& o) const {
  std::vector<std::string> why;
  if (o.handles > 0) why.push_back(std::to_string(o.handles) + " owner handle(s) alive");
  if (o.expected_gets > 0) why.push_back(std::to_string(o.expected_gets) + " expected get(s) left");
  const auto now = Clock::now();
  if (o.handles == 0 && now < o.keep_until) {
    why.push_back("kept for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     o.keep_until - now)
                                     .count()) +
                  " ms more");
  }
  if (o.local_leases > 0) why.push_back(std::to_string(o.local_leases) + " transfer(s) or borrow(s) by the owner or a remote consumer");
  for (const auto& [uuid, c] : consumers) {
    if (c->lane && c->lane->holds(o.slot, o.generation)) {
      why.push_back("leased by agent '" + c->identity.name + "' (pid " +
                    std::to_string(c->identity.pid) + ")");
    }
  }
  std::string out = "object " + std::to_string(o.id) + " (";
  for (size_t i = 0; i < why.size(); ++i) out += (i ? "; " : "") + why[i];
  return out + ")";
}

void AgentCore::wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const char* lo = static_cast<const char*>(tensor.data());
  const char* hi = lo + tensor.nbytes();
  std::unique_lock<std::mutex> lock(mutex);
  auto holders = [&] {
    std::vector<const Object*> out;
    for (const auto& [id, o] : objects) {
      for (const TensorView& t : o.tensors) {
        const char* a = static_cast<const char*>(t.data());
        if (t.device() == tensor.device() && t.nbytes() > 0 && a < hi && lo < a + t.nbytes()) {
          out.push_back(&o);
          break;
        }
      }
    }
    return out;
  };
  while (true) {
    const auto held = holders();
    if (held.empty()) {
      // Objects over these bytes that the owner wrote while published (check_writes).
      for (auto v = violations.begin(); v != violations.end(); ++v) {
        for (const TensorView& t : v->tensors) {
          const char* a = static_cast<const char*>(t.data());
          if (t.device() == tensor.device() && t.nbytes() > 0 && a < hi && lo < a + t.nbytes()) {
            const std::string text = v->text;
            violations.erase(v);
            throw Error(ErrorCode::kRemoteError, "wait_tensor_freed on " + who() + ": " + text);
          }
        }
      }
      return;
    }
    if (Clock::now() >= deadline) {
      std::string list;
      for (const Object* o : held) list += (list.empty() ? "" : ", ") + blockers_locked(*o);
      throw Error(ErrorCode::kTimeout, "wait_tensor_freed on " + who() + ": " + tensor.str() +
                                           " still published after " +
                                           std::to_string(timeout.count()) + " ms: " + list);
    }
    changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    reap_consumers_locked();  // a consumer that exited after its connections closed
    settle_all_locked();  // a lane may have let go without telling (a consumer thread's exit)
  }
}

void AgentCore::housekeeping_loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping) {
    auto wake = Clock::now() + std::chrono::milliseconds(200);
    for (const auto& [id, o] : objects) {
      if (o.handles == 0 && o.state != kSlotRetiring && o.keep_until > Clock::now()) {
        wake = std::min(wake, o.keep_until);
      }
    }
    changed.wait_until(lock, wake);
    reap_consumers_locked();
    settle_all_locked();
    lock.unlock();
    reap_peers();
    lock.lock();
  }
}

void AgentCore::drop_consumer_locked(const std::string& uuid) {
  auto c = consumers.find(uuid);
  if (c == consumers.end()) return;
  for (const auto& [id, count] : c->second->leases) {
    auto it = objects.find(id);
    if (it != objects.end()) it->second.local_leases -= count;
  }
  if (c->second->pidfd >= 0) ::close(c->second->pidfd);
  consumers.erase(c);
  settle_all_locked();
}

void AgentCore::reap_consumers_locked() {
  std::vector<std::string> gone;
  for (const auto& [uuid, c] : consumers) {
    if (c->connections > 0 || c->pidfd < 0) continue;
    pollfd p{c->pidfd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) gone.push_back(uuid);
  }
  for (const std::string& uuid : gone) drop_consumer_locked(uuid);
}

void AgentCore::accept_loop(int listener, bool local) {
  while (!stopping) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (stopping || errno == EINVAL || errno == EBADF) return;
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    auto conn = std::make_unique<Connection>(fd, local ? "a consumer on this host" : "a remote consumer");
    if (local && conn->peer_uid() != static_cast<long>(::getuid())) {
      TUTTI_LOG_WARN("direct transport: {} refused a connection from uid {}", who(), conn->peer_uid());
      try {
        const Error e(ErrorCode::kUnavailable,
                      who() + " runs as uid " + std::to_string(::getuid()) +
                          " and serves no other user on its host (uid " +
                          std::to_string(conn->peer_uid()) +
                          "): the owner's TCP listener (TransferAgentOptions::listen_tcp) is the way");
        conn->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::milliseconds(100));
      } catch (const Error&) {
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping) return;
    serving_fds.insert(fd);
    ++serving_threads;
    std::thread([self = shared_from_this(), c = std::move(conn), local]() mutable {
      self->serve(std::move(c), local);
    }).detach();
  }
}

namespace {

// Settles object `id` (every object: kAll; nothing: kNone) when the scope ends, so after the
// answer to the message that led to it went, or failed to: settling may free the object, and an
// owner waiting for that (wait_tensor_freed) may exit at once, before a later answer went, and
// fail a get that has its bytes ("closed the connection"; OwnerExits.TheGetThatFreesTheObject
// Succeeds).
struct SettleAfter {
  static constexpr uint64_t kNone = 0;  // object ids count from 1
  static constexpr uint64_t kAll = ~uint64_t{0};
  SettleAfter(AgentCore& c, uint64_t i) : core(c), id(i) {}
  ~SettleAfter() {
    if (id == kNone) return;
    std::lock_guard<std::mutex> lock(core.mutex);
    if (id == kAll) {
      core.settle_all_locked();
    } else if (auto it = core.objects.find(id); it != core.objects.end()) {
      core.settle_locked(it->second);
    }
  }
  AgentCore& core;
  const uint64_t id;
};

}  // namespace

void AgentCore::serve(std::unique_ptr<Connection> conn, bool local) {
  std::shared_ptr<Consumer> consumer;
  const int fd = conn->fd();
  auto reply = [&](const std::string& payload, const std::vector<int>& fds = {}) {
    conn->send(MsgType::kReply, payload, fds, Clock::now() + fetch_timeout);
  };
  auto find_live = [&](std::unique_lock<std::mutex>&, uint64_t id, uint32_t gen,
                       const char* what) -> Object& {
    auto it = objects.find(id);
    if (it == objects.end() || it->second.generation != gen) {
      (void)what;
      throw Error(ErrorCode::kInvalidUsage,
                  "object " + std::to_string(id) + " " + freed_text_locked(id) + " at its owner");
    }
    return it->second;
  };
  try {
    // A remote consumer's connection in TLS first, when this agent has it.
    if (!local) {
      // TLS on one side only: the other is told in the clear, and the connection ends.
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      const bool tls_hello = looks_like_tls(conn->peek(3, deadline));
      if (tls_hello != (tls_server != nullptr)) {
        const Error e(ErrorCode::kInvalidArgument,
                      tls_server ? who() + " takes TLS connections only (TUTTI_TRANSFER_TLS=1 "
                                           "on its side): the consumer needs it too"
                                 : who() + " does not use TLS, and the consumer does "
                                           "(TUTTI_TRANSFER_TLS must be the same on both)");
        TUTTI_LOG_WARN("direct transport: {} refused {}: {}", who(), conn->peer(), e.what());
        conn->send(MsgType::kError, error_payload(e), {}, deadline);
        throw e;
      }
      if (tls_server) conn->start_tls(tls_server.get(), /*server=*/true, deadline);
    }
    while (!stopping) {
      Message m;
      try {
        m = conn->receive(Clock::now() + std::chrono::seconds(1));
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kTimeout) continue;
        break;  // the consumer went
      }
      if (m.type != MsgType::kHello) {
        for (int f : m.fds) ::close(f);  // only a hello carries descriptors
        m.fds.clear();
        if (!consumer) {
          // Nothing is served before a hello that passed: answer once, then hang up.
          const Error e(ErrorCode::kInvalidUsage,
                        who() + " serves nothing to a connection that has not said hello");
          conn->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(1));
          break;
        }
      }
      try {
        WireReader r(m.payload, "a request to " + who());
        switch (m.type) {
          case MsgType::kHello: {
            if (consumer) {
              for (int f : m.fds) ::close(f);
              throw Error(ErrorCode::kInvalidUsage, "a second hello on one connection");
            }
            AgentIdentity them;
            uint32_t version = 0;
            std::string their_nonce;
            try {
              them = decode_identity(r.str32("identity", 4096));
              r.str32("proof", 64);  // protocol 1's proof; empty from protocol 2 on
              // A hello from before versions ends after the proof: protocol 0.
              version = r.left() >= 4 ? r.u32("protocol version") : 0;
              if (version == kProtocolVersion) their_nonce = r.str8("nonce");
            } catch (...) {
              for (int f : m.fds) ::close(f);
              throw;
            }
            std::string refused;
            if (version != kProtocolVersion) {
              refused = "hello to " + who() + ": agent '" + them.name +
                        "' speaks the direct transport's protocol " + std::to_string(version) +
                        ", this agent " + std::to_string(kProtocolVersion) +
                        " (different tutti versions)";
            }
            std::string my_nonce;
            if (refused.empty() && !options.secret.empty()) {
              // A proof over a nonce of this connection's own: one seen on another connection
              // (read off the wire) is worth nothing here.
              my_nonce = random_bytes(kHelloNonceBytes);
              WireWriter challenge;
              challenge.str8(my_nonce);
              try {
                conn->send(MsgType::kChallenge, challenge.out(), {}, Clock::now() + fetch_timeout);
              } catch (const Error& e) {
                for (int f : m.fds) ::close(f);
                throw Error(ErrorCode::kIoError, "hung up: the challenge to agent '" + them.name +
                                                     "' did not go: " + e.what());
              }
              std::string proof;  // none (no answer in time, or another message): refused
              try {
                Message p = conn->receive(Clock::now() + fetch_timeout);
                for (int f : p.fds) ::close(f);
                if (p.type == MsgType::kProof) {
                  WireReader pr(p.payload, "a hello's proof");
                  proof = pr.str8("proof");
                }
              } catch (const Error& e) {
                if (e.code() == ErrorCode::kIoError) {
                  for (int f : m.fds) ::close(f);
                  throw;  // the consumer went
                }
              }
              if (!same_secret(proof, hello_proof(options.secret, "consumer", identity, them,
                                                  my_nonce, their_nonce))) {
                refused = "hello to " + who() + ": agent '" + them.name +
                          "' does not know the shared secret";
              }
            }
            if (refused.empty() && local && conn->peer_pid() != static_cast<long>(them.pid)) {
              refused = "hello to " + who() + ": agent '" + them.name + "' says it is pid " +
                        std::to_string(them.pid) + ", its socket is pid " +
                        std::to_string(conn->peer_pid());
            }
            if (!refused.empty()) {
              for (int f : m.fds) ::close(f);
              const Error e(ErrorCode::kInvalidArgument, refused);
              conn->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(1));
              TUTTI_LOG_WARN("direct transport: {}", refused);
              throw Error(ErrorCode::kIoError, "hung up: " + refused);  // ends the connection
            }
            conn->set_peer("agent '" + them.name + "'");
            {
              std::lock_guard<std::mutex> lock(mutex);
              auto& c = consumers[them.uuid_text()];
              if (!c) {
                c = std::make_shared<Consumer>();
                c->identity = them;
                if (local) {
                  // Its exit shows on a pidfd, taken while the pid is still its process.
                  const int pfd = static_cast<int>(
                      ::syscall(SYS_pidfd_open, static_cast<pid_t>(them.pid), 0));
                  if (pfd >= 0 && process_start_time(static_cast<long>(them.pid)) == them.start_time) {
                    c->pidfd = pfd;
                  } else if (pfd >= 0) {
                    ::close(pfd);
                  }
                }
              }
              if (local && !m.fds.empty()) {
                if (!c->lane) {
                  c->lane = std::make_unique<LaneView>(m.fds[0]);
                } else {
                  ::close(m.fds[0]);
                }
                for (size_t i = 1; i < m.fds.size(); ++i) ::close(m.fds[i]);
              }
              if (!consumer) {
                consumer = c;
                ++c->connections;
              }
            }
            std::vector<int> fds;
            if (local) fds.push_back(slots.fd());
            WireWriter answer;
            answer.str32(encode_identity(identity));
            answer.u32(kProtocolVersion);
            // The owner proves the secret too: a consumer is not fooled by an impostor that
            // took the owner's address.
            answer.str8(options.secret.empty() ? std::string()
                                               : hello_proof(options.secret, "owner", identity,
                                                             them, my_nonce, their_nonce));
            reply(answer.out(), fds);
            break;
          }
          case MsgType::kCall: {
            const std::string name = r.str8("transport");
            const std::string request = r.str32("request", 1u << 24);
            std::vector<int> fds;
            const std::string answer = transport(name).answer(
                request, consumer ? consumer->identity : AgentIdentity{}, &fds);
            try {
              reply(answer, fds);
            } catch (...) {
              for (int f : fds) ::close(f);
              throw;
            }
            for (int f : fds) ::close(f);
            break;
          }
          case MsgType::kWait: {
            const uint64_t id = r.u64("id");
            const uint32_t gen = r.u32("generation");
            const auto deadline = wire_deadline(r.u64("timeout"));
            WireWriter w;
            {
              std::unique_lock<std::mutex> lock(mutex);
              auto ready = [&] {
                auto it = objects.find(id);
                return stopping || it == objects.end() || it->second.generation != gen ||
                       it->second.state != kSlotReserved;
              };
              // In slices: a consumer that dies while it waits must not keep its holds.
              while (!ready() && Clock::now() < deadline) {
                changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
                if (hung_up(fd)) throw Error(ErrorCode::kIoError, "the consumer hung up while waiting");
              }
              Object& o = find_live(lock, id, gen, "get");
              if (o.state == kSlotReserved) {
                throw Error(ErrorCode::kTimeout, "object " + std::to_string(id) +
                                                     " is still reserved (never fulfilled)");
              }
              if (o.state == kSlotRetiring && !o.published) {
                throw Error(ErrorCode::kInvalidUsage, "object " + std::to_string(id) +
                                                          " was released before it was fulfilled");
              }
              w.u32(o.state);
              if (o.state == kSlotFailed) {
                w.str32(o.failure);
              } else {
                write_publication(w, o.publication, o.metas.size());
              }
            }
            reply(w.out());
            break;
          }
          // kGot, kReleased and kUnlease are answered before the settling they lead to (see
          // SettleAfter): settling may free an object, and an owner waiting for that may exit.
          case MsgType::kGot: {
            const uint64_t id = r.u64("id");
            const uint32_t gen = r.u32("generation");
            SettleAfter settle(*this, id);
            {
              std::lock_guard<std::mutex> lock(mutex);
              auto it = objects.find(id);
              if (it != objects.end() && it->second.generation == gen &&
                  it->second.expected_gets > 0) {
                if (--it->second.expected_gets == 0) slots.slot(it->second.slot).flags.store(0);
              }
            }
            reply("");
            break;
          }
          case MsgType::kReleased: {
            SettleAfter settle(*this, SettleAfter::kAll);
            reply("");
            break;
          }
          case MsgType::kLease:
          case MsgType::kUnlease: {
            const uint64_t id = r.u64("id");
            const uint32_t gen = r.u32("generation");
            std::unique_lock<std::mutex> lock(mutex);
            if (m.type == MsgType::kLease) {
              Object& o = find_live(lock, id, gen, "get");
              if (o.state != kSlotLive) {
                WireWriter w;
                w.u32(o.state);
                lock.unlock();
                reply(w.out());
                break;
              }
              ++o.local_leases;
              if (consumer) ++consumer->leases[id];
            } else {
              auto it = objects.find(id);
              if (consumer && consumer->leases[id] > 0) {
                if (--consumer->leases[id] == 0) consumer->leases.erase(id);
                if (it != objects.end()) --it->second.local_leases;
              }
            }
            lock.unlock();
            SettleAfter settle(*this, m.type == MsgType::kUnlease ? id : SettleAfter::kNone);
            WireWriter w;
            w.u32(kSlotLive);
            reply(w.out());
            break;
          }
          case MsgType::kStream: {
            const uint64_t id = r.u64("id");
            const uint32_t gen = r.u32("generation");
            const auto deadline = wire_deadline(r.u64("timeout"));
            const bool counts = r.u8("counts") != 0;
            std::vector<iovec> parts;
            uint64_t total = 0;
            {
              std::unique_lock<std::mutex> lock(mutex);
              changed.wait_until(lock, deadline, [&] {
                auto it = objects.find(id);
                return stopping || it == objects.end() || it->second.generation != gen ||
                       it->second.state != kSlotReserved;
              });
              Object& o = find_live(lock, id, gen, "get");
              require_live(o);
              ++o.local_leases;
              for (const TensorView& t : o.tensors) {
                parts.push_back({t.data(), t.nbytes()});
                total += t.nbytes();
              }
            }
            auto done = [&](bool completed) {
              std::lock_guard<std::mutex> lock(mutex);
              auto it = objects.find(id);
              if (it == objects.end()) return;
              --it->second.local_leases;
              if (completed && counts && it->second.expected_gets > 0 &&
                  --it->second.expected_gets == 0) {
                slots.slot(it->second.slot).flags.store(0);
              }
              settle_locked(it->second);
            };
            try {
              WireWriter w;
              w.u64(total);
              reply(w.out());
              conn->send_raw(parts, deadline);
            } catch (...) {
              done(false);
              throw;
            }
            done(true);
            break;
          }
          case MsgType::kFetch: {
            serve_fetch(r, [&](const std::string& payload) { reply(payload); },
                        consumer ? consumer->identity : AgentIdentity{});
            break;
          }
          default:
            throw Error(ErrorCode::kInvalidArgument,
                        who() + " got a message of unknown type " +
                            std::to_string(static_cast<int>(m.type)));
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kIoError) throw;  // the connection is gone
        conn->send(MsgType::kError, error_payload(e), {}, Clock::now() + std::chrono::seconds(5));
      }
    }
  } catch (const std::exception& e) {
    TUTTI_LOG_DEBUG("direct transport: {} stops serving {}: {}", who(), conn->peer(), e.what());
  }
  // A local consumer's last connection closing says little: a live one may have dropped it (a
  // cancelled or timed-out request). Its process's exit is what ends its holds; a dying process
  // closes its sockets just before its pidfd reads as exited, so look for a moment.
  bool exited = false;
  int pidfd = -1;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (consumer && consumer->connections == 1 && consumer->pidfd >= 0) pidfd = consumer->pidfd;
  }
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    exited = ::poll(&p, 1, 50) > 0;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (consumer && --consumer->connections == 0 && (consumer->pidfd < 0 || exited)) {
    drop_consumer_locked(consumer->identity.uuid_text());
  }
  serving_fds.erase(fd);
  conn.reset();
  if (--serving_threads == 0) serving_done.notify_all();
}

}  // namespace tutti::detail

namespace tutti::detail {

// A consumer's two-sided fetch: hold the object, queue its send on the transport's group and
// grant the pair's number. The reply is a status (kGranted + number, or kRefused / kRefusedUnseen
// + the error), never kError, so that the consumer knows whether its number was used up.
void AgentCore::serve_fetch(WireReader& r, const std::function<void(const std::string&)>& reply,
                            const AgentIdentity& consumer) {
  const std::string consumer_id = consumer.uuid_text();
  const uint64_t id = r.u64("id");
  const uint32_t gen = r.u32("generation");
  // At most a day, as every wait a consumer asks for (a larger one overflowed the clock's sum:
  // found by fuzzing).
  const std::chrono::milliseconds timeout(std::min<uint64_t>(r.u64("timeout"), 86400000));
  const auto deadline = wire_deadline(static_cast<uint64_t>(timeout.count()));
  // A reservation not fulfilled in time is refused a little before the consumer gives up, so
  // that the refusal reaches it (a consumer that gives up first must abort the group).
  const auto wait_deadline = deadline - std::min<std::chrono::milliseconds>(
                                            timeout / 4, std::chrono::milliseconds(500));
  const std::string name = r.str8("transport");
  const std::string set = r.str8("group set");
  const uint64_t incarnation = r.u64("incarnation");
  const int rank = static_cast<int>(r.u32("rank"));
  const uint64_t seq = r.u64("seq");
  WireWriter w;
  GroupTransport* g = nullptr;
  bool seen = false;  // the consumer's number is this side's to skip on a refusal
  try {
    g = dynamic_cast<GroupTransport*>(&transport(name));
    if (g == nullptr) {
      throw Error(ErrorCode::kInvalidArgument, "transport '" + name + "' is not two-sided");
    }
    g->check_peer(set, incarnation, rank, wait_deadline);
    seen = true;
    std::vector<TensorView> tensors;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait_until(lock, wait_deadline, [&] {
        auto it = objects.find(id);
        return stopping || it == objects.end() || it->second.generation != gen ||
               it->second.state != kSlotReserved;
      });
      auto it = objects.find(id);
      if (it == objects.end() || it->second.generation != gen) {
        throw Error(ErrorCode::kInvalidUsage,
                    "object " + std::to_string(id) + " " + freed_text_locked(id) + " at its owner");
      }
      Object& o = it->second;
      require_live(o);
      if (o.t != g) {
        throw Error(ErrorCode::kInvalidArgument, "object " + std::to_string(id) +
                                                     " was published on '" + o.transport + "'");
      }
      ++o.local_leases;  // until the send is done
      tensors = o.tensors;
    }
    std::weak_ptr<AgentCore> weak = weak_from_this();
    auto done = [weak, id](bool ok) {
      auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mutex);
      auto it = self->objects.find(id);
      if (it == self->objects.end()) return;
      --it->second.local_leases;
      if (ok && it->second.expected_gets > 0 && --it->second.expected_gets == 0) {
        self->slots.slot(it->second.slot).flags.store(0);
      }
      self->settle_locked(it->second);
    };
    std::shared_ptr<GroupJob> job;
    try {
      job = g->enqueue(GroupJob::Kind::kSend, rank, consumer_id, seq, incarnation,
                       std::move(tensors), deadline, done);
    } catch (...) {
      done(false);
      throw;
    }
    w.u8(0);
    w.u64(job->seq);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kIoError) throw;
    if (seen && seq > 0) g->skip(rank, consumer_id, seq, incarnation);
    TUTTI_LOG_DEBUG("direct transport: {} refuses a two-sided fetch of object {} by agent '{}': {}",
                    who(), id, consumer.name, e.what());
    w = WireWriter();
    w.u8(seen ? 1 : 2);
    w.str32(error_payload(e));
  }
  reply(w.out());
}

}  // namespace tutti::detail
