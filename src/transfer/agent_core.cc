// A TransferAgent's identity, and its start and stop (agent_core.h).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transfer/agent_core.h"
#include "util/crypto.h"
#include "util/fork_watch.h"
#include "util/host_identity.h"
#include "util/logging.h"
#include "util/tls.h"

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
  if (::gethostname(name, sizeof(name) - 1) == 0 &&
      ::getaddrinfo(name, nullptr, &hints, &info) == 0) {
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

}  // namespace

ObjectPin::~ObjectPin() {
  if (auto c = core.lock()) c->drop_pin(id);
}

AgentCore::AgentCore(const TransferAgentOptions& opts)
    : options(opts), fork_gen(fork_generation()) {
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
    // The transport's own secret first (Ray's workers get one for the cluster's agents without
    // touching the stores'), else the job's store secret.
    for (const char* name : {"TUTTI_TRANSFER_SECRET", "TUTTI_STORE_SECRET"}) {
      const char* s = std::getenv(name);
      if (s != nullptr && *s != '\0') {
        options.secret = s;
        break;
      }
    }
  }
  fetch_timeout = options.fetch_timeout.count() > 0 ? options.fetch_timeout : env_timeout();
  if (!options.tls) options.tls = tls_from_env("TUTTI_TRANSFER_TLS");
  if (options.tls) {
    if (options.secret.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  who() +
                      ": TLS (TransferAgentOptions::tls, TUTTI_TRANSFER_TLS) needs a secret, "
                      "which keys it: set TransferAgentOptions::secret, TUTTI_TRANSFER_SECRET "
                      "or TUTTI_STORE_SECRET");
    }
    tls_server = make_psk_context(/*server=*/true, options.secret, "tutti transfer");
    tls_client = make_psk_context(/*server=*/false, options.secret, "tutti transfer");
  }
  if (const char* v = std::getenv("TUTTI_RDT_CHECK")) check_writes_env = std::string(v) == "1";
}

std::string AgentCore::who() const {
  return "agent '" + identity.name + "'";
}

bool AgentCore::forked() const {
  return fork_gen != fork_generation();
}

void AgentCore::check_process(const char* op) const {
  if (forked()) {
    throw Error(ErrorCode::kInvalidUsage, std::string(op) + " on " + who() +
                                              ": the agent belongs to the parent process (pid " +
                                              std::to_string(identity.pid) +
                                              "); a forked child makes its own agent");
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
    new std::vector<std::thread>(std::move(workers));
    new std::vector<std::thread>(std::move(ended_workers));
    new std::map<std::thread::id, std::thread>(std::move(serving_threads));
    new std::vector<std::thread>(std::move(ended_serving));
    return;
  }
  abort_gets();
  // get_async's gets end now (cancelled, or failing at once as the agent stops).
  stop_workers(std::chrono::seconds(5));
  for (int fd : {unix_listener, tcp_listener}) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : acceptors) t.join();
  for (int fd : {unix_listener, tcp_listener}) {
    if (fd >= 0) ::close(fd);
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (int fd : serving_fds) ::shutdown(fd, SHUT_RDWR);
    changed.notify_all();
  }
  {
    // The transports' threads (the two-sided ones' groups) end now, not whenever the last
    // reference to the agent goes (a completion callback may hold one a moment longer), and
    // before the serving threads are waited for: one may be running a two-sided send, which
    // only this ends while its consumer is alive but not receiving (stopped, or slow).
    // Transports live as long as the agent: the pointers stay good outside the lock.
    std::vector<TensorTransport*> all;
    {
      std::lock_guard<std::mutex> lock(transports_mutex);
      for (auto& [name, t] : transports) all.push_back(t.get());
    }
    for (TensorTransport* t : all) t->stop();
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!serving_done.wait_for(lock, std::chrono::seconds(5),
                               [&] { return serving_threads.empty(); })) {
      TUTTI_LOG_WARN(
          "direct transport: {}: {} connection(s) still served 5 s after the agent was stopped; "
          "left to end on their own",
          who(), serving_threads.size());
      for (auto& [id, t] : serving_threads) t.detach();
      serving_threads.clear();
    }
  }
  join_ended_serving();
  if (housekeeper.joinable()) housekeeper.join();
  {
    // Whatever is still published goes with the agent (consumers' mappings stay readable).
    std::lock_guard<std::mutex> lock(mutex);
    while (!objects.empty()) free_locked(objects.begin());
  }
  std::lock_guard<std::mutex> lock(peers_mutex);
  peers.clear();
}

void AgentCore::serving_thread_ends_locked() {
  // Not there: stop() gave up waiting for it and left it detached.
  auto it = serving_threads.find(std::this_thread::get_id());
  if (it == serving_threads.end()) return;
  try {
    ended_serving.push_back(std::move(it->second));
  } catch (...) {  // out of memory: not joined, then (it ends in a moment)
    it->second.detach();
  }
  serving_threads.erase(it);
  if (serving_threads.empty()) serving_done.notify_all();
}

void join_ended(std::vector<std::thread>& ended) {
  for (std::thread& t : ended) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // never a self-join
    } else {
      t.join();  // past its end: a moment
    }
  }
  ended.clear();
}

void AgentCore::join_ended_serving() {
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lock(mutex);
    ended.swap(ended_serving);
  }
  join_ended(ended);
}

AgentCore::~AgentCore() {
  // Where the last reference went with a serving thread's end, that thread's own handle.
  for (auto* list : {&ended_serving, &ended_workers}) {
    for (std::thread& t : *list) {
      if (t.joinable()) t.detach();
    }
  }
}

std::string AgentCore::resolve_transport(const std::string& requested, DeviceType device) const {
  const std::string name = transport_key(requested);
  return name == "auto" ? auto_transport(device) : name;
}

}  // namespace tutti::detail
