#include "util/local_processes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "util/host_identity.h"

namespace tutti::detail {
namespace {

constexpr size_t kSlots = 1024;
constexpr size_t kMaskWords = 4;  // CPUs 0-255; CPUs beyond count as overlapping

struct alignas(64) Slot {
  std::atomic<int64_t> pid;     // 0: free
  std::atomic<uint64_t> start;  // the process's start time (process_start_time), 0 while claimed
  std::atomic<uint64_t> mask[kMaskWords];
  // The steady clock's milliseconds at its last op (or its registration), written by the process
  // `active_pid` says: a slot claimed by a tutti before these words (which it leaves as they
  // were, zero or a gone owner's) counts as active.
  std::atomic<int64_t> active_ms;
  std::atomic<int64_t> active_pid;
};
static_assert(sizeof(Slot) == 64, "one cache line per process");

Slot* open_table() {
  const std::string path = "/dev/shm/tutti-processes." + std::to_string(::getuid());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  const size_t bytes = kSlots * sizeof(Slot);
  // Only a table of this user's, of the right size (grown from empty by whoever came first).
  if (::fstat(fd, &st) != 0 || st.st_uid != ::getuid() ||
      (static_cast<size_t>(st.st_size) < bytes &&
       ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<Slot*>(p);
}

Slot* table() {
  static Slot* const t = open_table();  // mapped for the process's lifetime
  return t;
}

bool alive(const Slot& s) {
  const int64_t pid = s.pid.load();
  if (pid <= 0) return false;
  const uint64_t start = s.start.load();
  if (start == 0) return process_start_time(static_cast<long>(pid)) != 0;  // being claimed
  return process_start_time(static_cast<long>(pid)) == start;
}

void mask_words(const cpu_set_t& set, uint64_t out[kMaskWords]) {
  for (size_t w = 0; w < kMaskWords; ++w) out[w] = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (static_cast<size_t>(cpu) < 64 * kMaskWords) {
      out[cpu / 64] |= uint64_t{1} << (cpu % 64);
    } else {
      out[kMaskWords - 1] |= uint64_t{1} << 63;  // stands for every CPU beyond
    }
  }
}

std::atomic<long> registered_pid{0};
std::atomic<Slot*> registered_slot{nullptr};  // this process's, while registered_pid is its pid

int64_t steady_ms(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

}  // namespace

void (*local_process_claim_pause)() = nullptr;

void register_local_process() noexcept {
  const long me = static_cast<long>(::getpid());
  // Two threads registering at once take two slots: harmless, a process never counts its own.
  if (registered_pid.load() == me) {
    // Registered for an earlier group: active again from now (a group being made runs no op).
    note_local_activity_now(std::chrono::steady_clock::now());
    return;
  }
  Slot* t = table();
  if (t == nullptr) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return;
  uint64_t words[kMaskWords];
  mask_words(set, words);
  const uint64_t start = process_start_time(me);
  for (size_t i = 0; i < kSlots; ++i) {
    Slot& s = t[i];
    int64_t seen = s.pid.load();
    if (seen != 0 && alive(s)) continue;
    // Free, or its process is gone: claim it. Its start goes to 0 ("being claimed") before its
    // pid changes, so that no reader sees this pid beside the gone owner's start (alive() would
    // call it gone, and a count would free the slot under this process); a start changed since
    // it was read means another process claims the slot.
    uint64_t old_start = s.start.load();
    if (!s.start.compare_exchange_strong(old_start, 0)) continue;
    if (!s.pid.compare_exchange_strong(seen, me)) continue;
    if (local_process_claim_pause != nullptr) local_process_claim_pause();
    for (size_t w = 0; w < kMaskWords; ++w) s.mask[w].store(words[w]);
    s.active_ms.store(std::max<int64_t>(1, steady_ms(std::chrono::steady_clock::now())));
    s.active_pid.store(me);
    s.start.store(start);
    registered_slot.store(&s);
    registered_pid.store(me);
    return;
  }
}

std::atomic<int64_t> next_activity_note{0};

void note_local_activity_now(std::chrono::steady_clock::time_point now) noexcept {
  const int64_t ms = steady_ms(now);
  next_activity_note.store((now + std::chrono::milliseconds(100)).time_since_epoch().count(),
                           std::memory_order_relaxed);
  // A forked child's table slot is its parent's until it registers itself.
  if (registered_pid.load() != static_cast<long>(::getpid())) return;
  if (Slot* s = registered_slot.load()) s->active_ms.store(std::max<int64_t>(1, ms));
}

std::vector<long> local_processes(const cpu_set_t& cpus) {
  std::vector<long> out;
  Slot* const t = table();
  if (t == nullptr) return out;
  uint64_t want[kMaskWords];
  mask_words(cpus, want);
  const int64_t me = static_cast<int64_t>(::getpid());
  const int64_t idle_before = steady_ms(std::chrono::steady_clock::now()) - kIdleAfter.count();
  for (size_t i = 0; i < kSlots; ++i) {
    const Slot& s = t[i];
    const int64_t pid = s.pid.load(std::memory_order_relaxed);
    if (pid == 0 || pid == me) continue;
    bool overlaps = false;
    for (size_t w = 0; w < kMaskWords; ++w) overlaps |= (s.mask[w].load() & want[w]) != 0;
    if (!overlaps) continue;
    // Idle (by its own word): not counted, without reading /proc for it.
    if (s.active_pid.load(std::memory_order_relaxed) == pid &&
        s.active_ms.load(std::memory_order_relaxed) < idle_before) {
      continue;
    }
    if (alive(s)) {
      out.push_back(static_cast<long>(pid));
    } else {
      // Gone: free the slot, so that later counts need not look at its process again.
      int64_t gone = pid;
      t[i].pid.compare_exchange_strong(gone, 0);
    }
  }
  return out;
}

int count_local_processes(const cpu_set_t& cpus) noexcept {
  try {
    return 1 + static_cast<int>(local_processes(cpus).size());
  } catch (...) {
    return 1;
  }
}

}  // namespace tutti::detail
