// How many CPUs the ranks of one shm group can run on (internal to the shm backend): the union of
// their affinity masks (each rank's sched_getaffinity, exchanged through the group's store),
// capped by the CPU time their cgroup allows (cgroup v2's cpu.max). With more ranks than that, a
// rank that spins holds up the very rank it waits for. std::thread::hardware_concurrency() counts
// the machine's online CPUs, which says nothing of a Slurm cpuset, taskset or a container's limit.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace tutti::shm_backend {

// This process's affinity mask as hex digits: CPU 4k + b is bit b of digit k (trailing zero
// digits dropped; "" when unreadable).
inline std::string affinity_mask_text() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu += 4) {
    int digit = 0;
    for (int b = 0; b < 4; ++b) digit |= CPU_ISSET(cpu + b, &set) ? 1 << b : 0;
    out += "0123456789abcdef"[digit];
  }
  out.erase(out.find_last_not_of('0') + 1);
  return out;
}

// How many CPUs are in at least one of `masks` (as affinity_mask_text writes them; the first
// CPU_SETSIZE CPUs); 0 when none holds a CPU (or none is readable).
inline int cpus_in_union(const std::vector<std::string>& masks) {
  std::vector<int> digits;
  for (const std::string& m0 : masks) {
    // CPUs past what a cpu_set_t holds are not counted (mask_union cannot hold them either).
    const std::string m = m0.substr(0, CPU_SETSIZE / 4);
    if (digits.size() < m.size()) digits.resize(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) {
      const char c = m[i];
      const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0;
      digits[i] |= v;
    }
  }
  int n = 0;
  for (int d : digits) n += __builtin_popcount(static_cast<unsigned>(d));
  return n;
}

// The CPUs in at least one of `masks`, as a set (this process's mask where none is readable).
inline cpu_set_t mask_union(const std::vector<std::string>& masks) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const std::string& m : masks) {
    for (size_t i = 0; i < m.size() && 4 * i < CPU_SETSIZE; ++i) {
      const char c = m[i];
      const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0;
      for (int b = 0; b < 4; ++b) {
        if ((v >> b & 1) != 0 && 4 * i + b < CPU_SETSIZE)
          CPU_SET(static_cast<int>(4 * i + b), &set);
      }
    }
  }
  if (CPU_COUNT(&set) == 0 && ::sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
  return set;
}

// cgroup v2's cpu.max ("max 100000", "150000 100000"): the CPUs it allows, or 0 for no limit
// (and for text it cannot read).
inline double cpu_max_cpus(const std::string& text) {
  char* end = nullptr;
  const double quota = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || quota <= 0) return 0;  // "max", or nothing readable
  const double period = std::strtod(end, nullptr);
  return period > 0 ? quota / period : 0;
}

// The smallest cpu.max limit on this process's cgroup (v2) and its ancestors, in CPUs; 0: none.
inline double cgroup_cpu_limit() {
  std::ifstream groups("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(groups, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return 0;
  double limit = 0;
  while (true) {
    std::ifstream max("/sys/fs/cgroup" + (path == "/" ? std::string() : path) + "/cpu.max");
    std::string text;
    if (std::getline(max, text)) {
      const double cpus = cpu_max_cpus(text);
      if (cpus > 0 && (limit == 0 || cpus < limit)) limit = cpus;
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return limit;
}

// The CPUs the ranks can use: the union's count, capped by the cgroup's limit (whole CPUs, at
// least one); `fallback` when no mask was readable.
inline int usable_cpus(int in_union, double limit, int fallback) {
  int cpus = in_union > 0 ? in_union : fallback;
  // A limit at or above the count caps nothing (compared as doubles: a huge or odd cpu.max
  // must not overflow the conversion to int, found by fuzzing).
  if (limit > 0 && limit < static_cast<double>(cpus)) cpus = std::max(1, static_cast<int>(limit));
  return std::max(1, cpus);
}

// This thread's involuntary context switches so far: where they went up, the thread lost its
// CPU to another (a timed send's time then measures that thread's slice, shm_p2p.cc; a wait
// asks thread_lost_cpu_lately below).
inline long involuntary_switches() {
  struct rusage u;
  return ::getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_nivcsw : 0;
}

// This thread's CPU time so far, in ns (0 where it cannot be read: then every switch counts,
// off_cpu_counts below, and every timed collective costs the same, PublishTimer).
inline int64_t thread_cpu_ns() {
  timespec ts;
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Whether a timed stretch of `wall_ns` during which the thread ran `cpu_ns` on its CPU and was
// switched out `switches` times (involuntarily) measures something else than its own work: where
// it was off its CPU for more than 1% of it or more than 200 us (a timed send's: shm_p2p.cc; a
// collective's cost is its CPU time, shm_publish.h's PublishTimer). A kernel thread's few
// microseconds in a 36 ms op is no reason to leave the op out (at 64 MiB, with the CPUs far
// apart, nearly every timed op saw one, 2026-12-07); another process's slice (a build beside: a
// millisecond and more) is. A CPU time that could not be read (0) counts every switch.
inline bool off_cpu_counts(int64_t wall_ns, int64_t cpu_ns, long switches) {
  if (switches == 0) return false;
  if (cpu_ns <= 0 || wall_ns <= 0) return true;
  const int64_t off = wall_ns - cpu_ns;
  return off > 200000 || static_cast<double>(off) > 0.01 * static_cast<double>(wall_ns);
}

// Whether the calling thread lost its CPU to another thread lately (an involuntary context
// switch, getrusage): its count went up between two of these looks less than `window` apart,
// the later of them less than `window` ago. A thread's first look, and one after a longer gap,
// only note where the count stands (a switch counted since may be older than the window).
inline bool thread_lost_cpu_lately(std::chrono::steady_clock::duration window) {
  using Clock = std::chrono::steady_clock;
  thread_local long seen = -1;
  thread_local Clock::time_point looked_at{};
  thread_local Clock::time_point lost_at{};
  const long n = involuntary_switches();
  const Clock::time_point now = Clock::now();
  const bool first = seen < 0 || now - looked_at > window;
  if (!first && n != seen) lost_at = now;
  seen = n;
  looked_at = now;
  return !first && now - lost_at < window;
}

}  // namespace tutti::shm_backend
