#include "group/flight_recorder.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "group/group_util.h"
#include "util/host_identity.h"
#include "util/logging.h"
#include "util/op_clock.h"

namespace tutti::detail {
namespace {

constexpr size_t kDefaultCapacity = 64;
constexpr size_t kLoggedEntries = 8;  // without a directory, the log gets the last few ops

uint64_t power_of_two_at_least(size_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

size_t capacity_from_env() {
  const char* v = std::getenv("TUTTI_FLIGHT_RECORDER_SIZE");
  if (v == nullptr || *v == '\0') return kDefaultCapacity;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0') {
    TUTTI_LOG_WARN("TUTTI_FLIGHT_RECORDER_SIZE='{}' is not a number; keeping {} ops", v,
                   kDefaultCapacity);
    return kDefaultCapacity;
  }
  return static_cast<size_t>(std::min<unsigned long long>(n, 1 << 20));
}

std::string dump_dir() {
  const char* v = std::getenv("TUTTI_FLIGHT_RECORDER_DIR");
  return v == nullptr ? std::string() : std::string(v);
}

// Every live recorder of the process, for the signal's dump, each with the process that made
// it: a forked child's copies of its parent's recorders are the parent's to dump (the same files,
// which the child's view, frozen at the fork, would overwrite).
struct Registry {
  std::mutex mutex;
  std::vector<std::pair<std::weak_ptr<FlightRecorder>, pid_t>> recorders;
};

Registry& registry() {
  static auto* instance = [] {
    auto* reg = new Registry();  // leaked: the dumper thread may use it at exit
    // Held across fork(), so that a child never inherits it locked by the dumper thread.
    ::pthread_atfork([] { registry().mutex.lock(); }, [] { registry().mutex.unlock(); },
                     [] { registry().mutex.unlock(); });
    return reg;
  }();
  return *instance;
}

// The signal handler only writes a byte to a pipe; a thread of the library reads it and dumps.
// Both are this process's: a forked child inherits the handler and the pipe but not the thread,
// and a byte it wrote would have its parent dump the parent's groups. So the handler writes only
// in the process that made the pipe (getpid() is async-signal-safe), and a child that makes a
// recorder of its own makes its own pipe and thread.
std::atomic<int> g_signal_pipe[2] = {{-1}, {-1}};
std::atomic<pid_t> g_signal_pid{0};

extern "C" void on_dump_signal(int) {
  const int saved = errno;
  if (::getpid() == g_signal_pid.load(std::memory_order_acquire)) {
    const char byte = 1;
    if (::write(g_signal_pipe[1].load(std::memory_order_relaxed), &byte, 1) < 0) {
      // Nothing to do in a signal handler: the dump request is lost.
    }
  }
  errno = saved;
}

void dump_everything(const std::string& reason) {
  std::vector<std::shared_ptr<FlightRecorder>> live;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    const pid_t me = ::getpid();
    for (auto& [weak, pid] : registry().recorders) {
      if (pid != me) continue;
      if (auto r = weak.lock()) live.push_back(std::move(r));
    }
  }
  for (auto& r : live) r->dump(reason);
}

// Installs the dump signal once per process (a forked child again), where a directory is set
// and the program left the signal at its default (or to this handler, in a child).
void install_signal_once() {
  static std::atomic<pid_t> tried{0};
  const pid_t me = ::getpid();
  if (tried.load() == me) return;
  static std::mutex mutex;  // two threads of one process: one installs
  std::lock_guard<std::mutex> lock(mutex);
  if (tried.exchange(me) == me) return;
  [me] {
    if (dump_dir().empty()) return;
    const char* v = std::getenv("TUTTI_FLIGHT_RECORDER_SIGNAL");
    const std::string which = v == nullptr ? "USR1" : v;
    int sig = 0;
    if (which == "USR1" || which == "SIGUSR1") {
      sig = SIGUSR1;
    } else if (which == "USR2" || which == "SIGUSR2") {
      sig = SIGUSR2;
    } else if (which != "0" && !which.empty()) {
      TUTTI_LOG_WARN("TUTTI_FLIGHT_RECORDER_SIGNAL='{}': expected USR1, USR2 or 0; no signal",
                     which);
    }
    if (sig == 0) return;
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 ||
        (current.sa_handler != SIG_DFL && current.sa_handler != on_dump_signal)) {
      TUTTI_LOG_INFO("flight recorder: {} already has a handler; dumps only at aborts",
                     ::strsignal(sig));
      return;
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    // The handler never blocks: requests beyond the pipe's capacity are dropped.
    ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    // A parent's, inherited: not this process's to read or write.
    for (int i : {0, 1}) {
      const int old = g_signal_pipe[i].exchange(fds[i]);
      if (old >= 0) ::close(old);
    }
    // Started before the handler, and never joined: it lives as long as the process.
    std::thread([sig, in = fds[0]] {
      char byte;
      while (true) {
        const ssize_t n = ::read(in, &byte, 1);
        if (n == 1) {
          dump_everything(std::string("on demand (") + ::strsignal(sig) + ")");
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          return;
        }
      }
    }).detach();
    g_signal_pid.store(me, std::memory_order_release);
    struct sigaction action {};
    action.sa_handler = on_dump_signal;
    ::sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(sig, &action, nullptr);
  }();
}

const char* state_name(uint8_t state) {
  switch (state) {
    case 0: return "issued";
    case 1: return "started";
    case 2: return "completed";
    default: return "failed";
  }
}

const char* kind_of(OpType op) {
  switch (op) {
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kBatchP2P: return "batch";
    default: return "collective";
  }
}

}  // namespace

std::shared_ptr<FlightRecorder> FlightRecorder::create(Identity identity) {
  const size_t capacity = capacity_from_env();
  if (capacity == 0) return nullptr;
  auto recorder = std::make_shared<FlightRecorder>(std::move(identity), capacity);
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto& all = registry().recorders;
    all.erase(
        std::remove_if(all.begin(), all.end(), [](auto& entry) { return entry.first.expired(); }),
        all.end());
    all.emplace_back(recorder, ::getpid());
  }
  install_signal_once();
  return recorder;
}

FlightRecorder::FlightRecorder(Identity identity, size_t capacity)
    : identity_(std::move(identity)),
      steady_base_(std::chrono::steady_clock::now()),
      wall_base_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count()),
      capacity_(std::max<size_t>(capacity, 1)),
      mask_(power_of_two_at_least(capacity_) - 1),
      ring_(new Entry[mask_ + 1]),
      errors_(mask_ + 1) {}

FlightRecorder::~FlightRecorder() = default;

int64_t FlightRecorder::wall_us(std::chrono::steady_clock::time_point t) const {
  return wall_base_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(t - steady_base_).count();
}

int64_t FlightRecorder::now_us() const {
  return wall_us(detail::op_now());
}

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

void pack_sig(const OpSignature& sig, std::atomic<uint64_t>* out) {
  out[0].store(static_cast<uint64_t>(sig.op) | static_cast<uint64_t>(sig.dtype) << 8 |
                   static_cast<uint64_t>(static_cast<uint32_t>(sig.root)) << 32,
               kRelaxed);
  out[1].store(static_cast<uint64_t>(sig.count), kRelaxed);
  out[2].store(static_cast<uint64_t>(static_cast<uint32_t>(sig.devices)) << 32 |
                   static_cast<uint32_t>(sig.root_tensor),
               kRelaxed);
  out[3].store(static_cast<uint64_t>(static_cast<uint32_t>(sig.reduce_op)), kRelaxed);
  out[4].store(sig.layout, kRelaxed);
}

OpSignature unpack_sig(const std::atomic<uint64_t>* in) {
  OpSignature sig;
  const uint64_t w0 = in[0].load(kRelaxed), w2 = in[2].load(kRelaxed), w3 = in[3].load(kRelaxed);
  sig.op = static_cast<OpType>(w0 & 0xff);
  sig.dtype = static_cast<DType>((w0 >> 8) & 0xff);
  sig.root = static_cast<int>(static_cast<uint32_t>(w0 >> 32));
  sig.count = static_cast<int64_t>(in[1].load(kRelaxed));
  sig.devices = static_cast<int>(static_cast<uint32_t>(w2 >> 32));
  sig.root_tensor = static_cast<int>(static_cast<uint32_t>(w2));
  sig.reduce_op = static_cast<int>(static_cast<uint32_t>(w3));
  sig.layout = in[4].load(kRelaxed);
  return sig;
}

}  // namespace

uint64_t FlightRecorder::issue(const OpContext& ctx, int peer, bool running) {
  const int64_t when =
      ctx.started == std::chrono::steady_clock::time_point{} ? now_us() : wall_us(ctx.started);
  const uint64_t id = next_id_.load(kRelaxed);
  next_id_.store(id + 1, kRelaxed);  // one issuer at a time (the op lock)
  Entry& e = ring_[slot(id)];
  const uint64_t v = e.version.load(kRelaxed);
  e.version.store(v + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.tag.store(tag_of(id, running ? State::kStarted : State::kIssued), kRelaxed);
  e.seq.store(ctx.seq, kRelaxed);
  OpSignature sig = ctx.signature;
  sig.op = ctx.op;
  pack_sig(sig, e.sig);
  e.peer.store(peer, kRelaxed);
  e.issued_us.store(when, kRelaxed);
  e.started_us.store(running ? when : 0, kRelaxed);
  e.ended_us.store(0, kRelaxed);
  e.version.store(v + 2, std::memory_order_release);
  return id;
}

bool FlightRecorder::claim(Entry& e, uint64_t id, State to, bool exclusive) {
  if (exclusive) {
    if ((e.tag.load(kRelaxed) >> 2) != id) return false;
    e.tag.store(tag_of(id, to), kRelaxed);
    return true;
  }
  uint64_t now = e.tag.load(kRelaxed);
  while ((now >> 2) == id) {
    const auto state = static_cast<State>(now & 3);
    if (state == State::kCompleted || state == State::kFailed) return false;
    if (e.tag.compare_exchange_weak(now, tag_of(id, to), std::memory_order_release, kRelaxed)) {
      return true;
    }
  }
  return false;
}

void FlightRecorder::start(uint64_t id, std::chrono::steady_clock::time_point when) {
  Entry& e = ring_[slot(id)];
  if (claim(e, id, State::kStarted, false)) {
    e.started_us.store(std::max(wall_us(when), e.issued_us.load(kRelaxed)), kRelaxed);
  }
}

void FlightRecorder::finish(uint64_t id, const std::string* error, bool exclusive) {
  const int64_t now = now_us();
  Entry& e = ring_[slot(id)];
  if (error != nullptr) {
    std::lock_guard<std::mutex> lock(errors_mutex_);
    errors_[slot(id)] = {id, error->substr(0, 400)};
  }
  if (!claim(e, id, error == nullptr ? State::kCompleted : State::kFailed, exclusive)) return;
  // (The ops' clock may read a little before a time it gave on another thread: never an end
  // before the start.)
  int64_t started = e.started_us.load(kRelaxed);
  if (started == 0) {  // ended before it started (a queued op aborted): it starts as it ends
    started = std::max(now, e.issued_us.load(kRelaxed));
    e.started_us.store(started, kRelaxed);
  }
  e.ended_us.store(std::max(now, started), kRelaxed);
}

FlightRecorder::Copy FlightRecorder::read(uint64_t id) const {
  const Entry& e = ring_[slot(id)];
  Copy c;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t v = e.version.load(std::memory_order_acquire);
    if (v & 1) continue;  // being written
    const uint64_t tag = e.tag.load(kRelaxed);
    c.id = tag >> 2;
    c.state = static_cast<State>(tag & 3);
    c.seq = e.seq.load(kRelaxed);
    c.sig = unpack_sig(e.sig);
    c.peer = static_cast<int>(e.peer.load(kRelaxed));
    c.issued_us = e.issued_us.load(kRelaxed);
    c.started_us = e.started_us.load(kRelaxed);
    c.ended_us = e.ended_us.load(kRelaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.version.load(kRelaxed) == v) break;
  }
  // A finish that claimed the entry's last op and was overtaken, before it stamped its times,
  // by more than the ring's ops may have stamped them on the entry's new op: times the state
  // does not have yet are not shown.
  if (c.state == State::kIssued) c.started_us = 0;
  if (c.state == State::kIssued || c.state == State::kStarted) c.ended_us = 0;
  if (c.state == State::kFailed) {
    std::lock_guard<std::mutex> lock(errors_mutex_);
    const auto& err = errors_[slot(id)];
    if (err.first == c.id) c.error = err.second;
  }
  return c;
}

std::string FlightRecorder::text(const std::string& reason) const {
  std::vector<Copy> entries;
  const uint64_t next = next_id_.load(kRelaxed);
  const uint64_t first = next > capacity_ ? next - capacity_ : 1;
  for (uint64_t id = first; id < next; ++id) entries.push_back(read(id));
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string out = "tutti-flight-record 1\n";
  out +=
      "group name=" + escape_name(identity_.name) + " instance=" + escape_name(identity_.instance) +
      " rank=" + std::to_string(identity_.rank) + " world=" + std::to_string(identity_.world_size) +
      " backend=" + escape_name(identity_.backend) + " pid=" + std::to_string(::getpid()) +
      " host=" + escape_name(host) + " dumped_us=" + std::to_string(now_us()) +
      " reason=" + escape_name(reason) + "\n";
  for (const Copy& e : entries) {
    if (e.id == 0) continue;
    out += "op id=" + std::to_string(e.id) + " seq=" + std::to_string(e.seq) +
           " kind=" + kind_of(e.sig.op) + " peer=" + std::to_string(e.peer) +
           " op=" + to_string(e.sig.op) + " sig=" + escape_name(e.sig.str()) +
           " state=" + state_name(static_cast<uint8_t>(e.state)) +
           " issued_us=" + std::to_string(e.issued_us) +
           " started_us=" + std::to_string(e.started_us) +
           " ended_us=" + std::to_string(e.ended_us) + " error=" + escape_name(e.error) + "\n";
  }
  out += "end\n";
  return out;
}

void FlightRecorder::dump(const std::string& reason) const {
  try {
    const std::string dir = dump_dir();
    const std::string body = text(reason);
    if (dir.empty()) {
      // The header and the last few ops, one log line.
      size_t cut = 0, lines = 0;
      for (size_t at = body.size(); at > 0 && lines <= kLoggedEntries + 1; --at) {
        if (body[at - 1] == '\n') {
          ++lines;
          cut = at;
        }
      }
      const size_t header_end = body.find('\n', body.find('\n') + 1) + 1;
      std::string shown = body.substr(0, header_end);
      if (cut > header_end) shown += "...\n";
      shown += body.substr(std::max(cut, header_end));
      TUTTI_LOG_WARN(
          "flight record of group '{}' (rank {}/{}), {} (set "
          "TUTTI_FLIGHT_RECORDER_DIR for files that tutti-flight merges):\n{}",
          identity_.name, identity_.rank, identity_.world_size, reason, shown);
      return;
    }
    ::mkdir(dir.c_str(), 0755);  // one level; an existing directory is fine
    const std::string path = dir + "/tutti-flight." + escape_name(identity_.instance) + ".rank" +
                             std::to_string(identity_.rank) + ".txt";
    // A temporary name of this dump's own: an abort's dump and a signal's (SIGUSR1) of the same
    // group at once wrote one file (O_TRUNC), and the record renamed into place could be both.
    static std::atomic<uint64_t> dumps{0};
    const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." +
                            std::to_string(dumps.fetch_add(1, std::memory_order_relaxed));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      TUTTI_LOG_WARN("flight recorder: cannot write {}: {}", tmp, std::strerror(errno));
      return;
    }
    size_t done = 0;
    while (done < body.size()) {
      const ssize_t n = ::write(fd, body.data() + done, body.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    // close() can report a write that failed late (NFS, a full disk's delayed allocation).
    const bool closed = ::close(fd) == 0;
    if (done != body.size() || !closed || ::rename(tmp.c_str(), path.c_str()) != 0) {
      TUTTI_LOG_WARN("flight recorder: writing {} failed: {}", path, std::strerror(errno));
      ::unlink(tmp.c_str());
      return;
    }
    TUTTI_LOG_INFO("flight record of group '{}' (rank {}/{}) written to {} ({})", identity_.name,
                   identity_.rank, identity_.world_size, path, reason);
  } catch (const std::exception& e) {
    TUTTI_LOG_WARN("flight recorder: dump failed: {}", e.what());
  }
}

}  // namespace tutti::detail
