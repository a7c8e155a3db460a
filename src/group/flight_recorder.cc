#include "group/flight_recorder.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "group/group_util.h"
#include "util/host_identity.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

constexpr size_t kDefaultCapacity = 64;
constexpr size_t kLoggedEntries = 8;  // without a directory, the log gets the last few ops

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

// Every live recorder of the process, for the signal's dump.
struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
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
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_dump_signal(int) {
  const int saved = errno;
  const char byte = 1;
  if (::write(g_signal_pipe[1], &byte, 1) < 0) {
    // Nothing to do in a signal handler: the dump request is lost.
  }
  errno = saved;
}

void dump_everything(const std::string& reason) {
  std::vector<std::shared_ptr<FlightRecorder>> live;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    for (auto& weak : registry().recorders) {
      if (auto r = weak.lock()) live.push_back(std::move(r));
    }
  }
  for (auto& r : live) r->dump(reason);
}

// Installs the dump signal once per process, where a directory is set and the program left
// the signal at its default.
void install_signal_once() {
  static std::once_flag once;
  std::call_once(once, [] {
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
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) {
      TUTTI_LOG_INFO("flight recorder: {} already has a handler; dumps only at aborts",
                     ::strsignal(sig));
      return;
    }
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) return;
    // The handler never blocks: in a forked child, where no thread reads the pipe, requests
    // beyond the pipe's capacity are dropped.
    ::fcntl(g_signal_pipe[1], F_SETFL, ::fcntl(g_signal_pipe[1], F_GETFL) | O_NONBLOCK);
    // Started before the handler, and never joined: it lives as long as the process.
    std::thread([sig] {
      char byte;
      while (true) {
        const ssize_t n = ::read(g_signal_pipe[0], &byte, 1);
        if (n == 1) {
          dump_everything(std::string("on demand (") + ::strsignal(sig) + ")");
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          return;
        }
      }
    }).detach();
    struct sigaction action {};
    action.sa_handler = on_dump_signal;
    ::sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(sig, &action, nullptr);
  });
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
    all.erase(std::remove_if(all.begin(), all.end(), [](auto& w) { return w.expired(); }),
              all.end());
    all.push_back(recorder);
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
      ring_(new Entry[capacity_]) {}

FlightRecorder::~FlightRecorder() = default;

int64_t FlightRecorder::wall_us(std::chrono::steady_clock::time_point t) const {
  return wall_base_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(t - steady_base_).count();
}

int64_t FlightRecorder::now_us() const { return wall_us(std::chrono::steady_clock::now()); }

void FlightRecorder::lock_entry(Entry& e) {
  while (e.busy.exchange(1, std::memory_order_acquire) != 0) {
    while (e.busy.load(std::memory_order_relaxed) != 0) std::this_thread::yield();
  }
}

FlightRecorder::Entry* FlightRecorder::lock(uint64_t id) {
  Entry& e = ring_[id % capacity_];
  lock_entry(e);
  if (e.id == id) return &e;
  unlock(e);
  return nullptr;
}

uint64_t FlightRecorder::issue(const OpContext& ctx, int peer, bool running) {
  const int64_t when =
      ctx.started == std::chrono::steady_clock::time_point{} ? now_us() : wall_us(ctx.started);
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  Entry& e = ring_[id % capacity_];
  lock_entry(e);
  e.id = id;
  e.seq = ctx.seq;
  e.sig = ctx.signature;
  e.sig.op = ctx.op;
  e.peer = peer;
  e.state = running ? State::kStarted : State::kIssued;
  e.issued_us = when;
  e.started_us = running ? when : 0;
  e.ended_us = 0;
  e.error.clear();
  unlock(e);
  return id;
}

void FlightRecorder::start(uint64_t id, std::chrono::steady_clock::time_point when) {
  const int64_t now = wall_us(when);
  if (Entry* e = lock(id)) {
    e->state = State::kStarted;
    e->started_us = now;
    unlock(*e);
  }
}

void FlightRecorder::finish(uint64_t id, const std::string* error) {
  const int64_t now = now_us();
  if (Entry* e = lock(id)) {
    if (e->started_us == 0) e->started_us = now;
    e->ended_us = now;
    e->state = error == nullptr ? State::kCompleted : State::kFailed;
    if (error != nullptr) e->error = error->substr(0, 400);
    unlock(*e);
  }
}

std::string FlightRecorder::text(const std::string& reason) const {
  struct Copy {
    uint64_t id, seq;
    OpSignature sig;
    int peer;
    State state;
    int64_t issued_us, started_us, ended_us;
    std::string error;
  };
  std::vector<Copy> entries;
  const uint64_t next = next_id_.load(std::memory_order_relaxed);
  const uint64_t first = next > capacity_ ? next - capacity_ : 1;
  for (uint64_t id = first; id < next; ++id) {
    Entry& e = ring_[id % capacity_];
    lock_entry(e);
    entries.push_back(Copy{e.id, e.seq, e.sig, e.peer, e.state, e.issued_us, e.started_us,
                           e.ended_us, e.error});
    unlock(e);
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string out = "tutti-flight-record 1\n";
  out += "group name=" + escape_name(identity_.name) + " instance=" +
         escape_name(identity_.instance) + " rank=" + std::to_string(identity_.rank) +
         " world=" + std::to_string(identity_.world_size) + " backend=" +
         escape_name(identity_.backend) + " pid=" + std::to_string(::getpid()) + " host=" +
         escape_name(host) + " dumped_us=" + std::to_string(now_us()) +
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
      TUTTI_LOG_WARN("flight record of group '{}' (rank {}/{}), {} (set "
                     "TUTTI_FLIGHT_RECORDER_DIR for files that tutti-flight merges):\n{}",
                     identity_.name, identity_.rank, identity_.world_size, reason, shown);
      return;
    }
    ::mkdir(dir.c_str(), 0755);  // one level; an existing directory is fine
    const std::string path = dir + "/tutti-flight." + escape_name(identity_.instance) + ".rank" +
                             std::to_string(identity_.rank) + ".txt";
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
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
    ::close(fd);
    if (done != body.size() || ::rename(tmp.c_str(), path.c_str()) != 0) {
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
