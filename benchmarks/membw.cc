// The machine's memory ceiling, beside the allreduce sweep: how many bytes per second one core,
// and every core at once, moves through memory at the sizes the sweep measures, for three
// kernels over float32 buffers of S bytes: memcpy (reads S, writes S), an update in place
// (a += 1: reads S, writes S back) and a reduction (a += b: reads 2S, writes S).
//
// The floor it gives an allreduce: in place, every rank must at least read its S bytes and
// write the result back, 2 S per rank, 2 n S for n ranks, whatever the algorithm (what it reads
// of its peers' comes on top, from cache when it is done well). So no in-place allreduce of S
// bytes on n ranks takes less than 2 n S / (the update's rate with every core running), and
// benchmarks/verdict.py prints tutti's time against that floor as a fraction (its "busbw
// against the memory's bound").
//
// And the floor of the smallest sizes: how long two cores take to exchange a cache line, each
// publishing one (a sequentially consistent store, as shm's small-message slot is) and waiting
// for the other's, as the two ranks of an 8-byte allreduce do. What an allreduce takes beyond
// it is software: the library's, and the benchmark's loop around the call.
//
//   build/bin/tutti-membw [-s 16M,64M] [-n 9] [--threads 1,2] [--json results/membw.json]
//   build/bin/tutti-membw --exchange-only [-n 3]   # the exchange alone: its ns on one line
//
// The exchange is not one figure on these VMs: over minutes it moved between ~50 ns (the two
// vCPUs on one physical core, as it seems) and ~250 ns, and every small-size time with it;
// benchmarks/machine.py takes it before and after each benchmark run (--exchange).
//
// GB/s are bytes read plus bytes written per second (write-allocate reads not counted), per
// core (the slowest of those running) and in all. Each figure is the best of -n repetitions: a
// ceiling is what the memory did at its fastest (the median of 5 moved by 60-87 GB/s at 64 MiB
// on 2 cores from run to run here, and the allreduce measured against it read up to 141%).
// Threads are bound to CPUs 0, 1, ... and touch their own buffers first.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "parse_size.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const size_t end = comma == std::string::npos ? text.size() : comma;
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string size_text(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

enum class Kernel { kCopy, kUpdate, kAdd };

// Vectorised as wide as the library's reduction kernels are, under the same conditions
// (src/tensor/reduction.cc: AVX2 where the CPU has it; x86-64 GCC, not under ThreadSanitizer),
// so that the bound is the memory's, not a narrower loop's.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define TUTTI_MEMBW_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TUTTI_MEMBW_MULTIVERSION
#endif

TUTTI_MEMBW_MULTIVERSION void update(float* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += 1.0f;
}

TUTTI_MEMBW_MULTIVERSION void add(float* __restrict a, const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

// Bytes each kernel reads and writes over a buffer of S bytes.
double traffic(Kernel k, uint64_t bytes) {
  return static_cast<double>(bytes) * (k == Kernel::kAdd ? 3 : 2);
}

// Runs `kernel` over S bytes on `threads` threads at once, `reps` times; the least over reps of
// the slowest thread's time, in seconds.
double measure(Kernel kernel, uint64_t bytes, int threads, int reps) {
  std::vector<double> slowest(static_cast<size_t>(reps), 0.0);
  // The threads start each pass together, meeting among themselves; this thread only joins
  // them. (It used to release each pass itself, spinning meanwhile: on 2 CPUs that spin took
  // one thread's CPU, and 2 threads at 64 MiB measured 28 GB/s in all where they move ~90.)
  std::atomic<int> arrived{0};
  std::vector<std::vector<double>> times(static_cast<size_t>(threads),
                                         std::vector<double>(static_cast<size_t>(reps)));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      bind_to(t);
      const size_t n = bytes / sizeof(float);
      // Touched here, on this thread's CPU; b only where the kernel reads it (an update's
      // idle b, 64 MiB a thread, crowded a out of the cache: 51-76 GB/s in all at 64 MiB on 2
      // cores with it, 77-85 without).
      std::vector<float> a(n, 1.0f), b(kernel == Kernel::kUpdate ? 0 : n, 2.0f);
      for (int r = -1; r < reps; ++r) {  // r = -1: a warm-up pass
        arrived.fetch_add(1);
        while (arrived.load() < threads * (r + 2)) {
        }
        const auto t0 = Clock::now();
        if (kernel == Kernel::kCopy) {
          std::memcpy(a.data(), b.data(), n * sizeof(float));
        } else if (kernel == Kernel::kUpdate) {
          update(a.data(), n);
        } else {
          add(a.data(), b.data(), n);
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= 0) times[static_cast<size_t>(t)][static_cast<size_t>(r)] = s;
        // Keep the result live.
        if (a[n / 2] == -1.0f) std::fprintf(stderr, "?");
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int r = 0; r < reps; ++r) {
    for (int t = 0; t < threads; ++t) {
      slowest[static_cast<size_t>(r)] = std::max(
          slowest[static_cast<size_t>(r)], times[static_cast<size_t>(t)][static_cast<size_t>(r)]);
    }
  }
  return *std::min_element(slowest.begin(), slowest.end());
}

// The time of one exchange of a cache line between CPUs 0 and 1, in ns: two threads, each
// publishing its own line's count and waiting until the other's is as far, `rounds` times; the
// best of `reps` (a descheduled thread is not the machine's floor). 0 where there is one CPU.
double exchange_ns(int reps) {
  if (std::thread::hardware_concurrency() < 2) return 0;
  constexpr int kRounds = 200000;
  struct alignas(64) Line {
    std::atomic<uint64_t> count{0};
  };
  double best = 0;
  for (int r = -1; r < reps; ++r) {  // r = -1: a warm-up
    Line lines[2];
    double ns[2] = {0, 0};
    auto side = [&](int me) {
      bind_to(me);
      Line& mine = lines[me];
      Line& theirs = lines[1 - me];
      const auto t0 = Clock::now();
      for (uint64_t i = 1; i <= kRounds; ++i) {
        mine.count.store(i);
        while (theirs.count.load(std::memory_order_acquire) < i) {
        }
      }
      ns[me] = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kRounds;
    };
    std::thread other(side, 1);
    side(0);
    other.join();
    const double t = std::max(ns[0], ns[1]);
    if (r >= 0 && (best == 0 || t < best)) best = t;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {16ull << 20, 64ull << 20};
  std::vector<int> thread_counts = {
      1, static_cast<int>(std::max(1u, std::min(2u, std::thread::hardware_concurrency())))};
  int reps = 9;
  std::string json;
  bool exchange_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: tutti-membw [-s 16M,64M] [-n 9] [--threads 1,2] [--json FILE]\n"
          "       tutti-membw --exchange-only [-n 3]\n");
      return 0;
    } else if (a == "--exchange-only") {
      exchange_only = true;
    } else if (a == "-s" && has_value) {
      sizes.clear();
      for (const auto& s : split(argv[++i])) sizes.push_back(parse_size(s));
    } else if (a == "-n" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && has_value) {
      thread_counts.clear();
      for (const auto& s : split(argv[++i]))
        thread_counts.push_back(std::max(1, std::atoi(s.c_str())));
    } else if (a == "--json" && has_value) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "tutti-membw: unknown or incomplete option '%s' (see --help)\n",
                   a.c_str());
      return 2;
    }
  }
  if (exchange_only) {
    std::printf("%.1f\n", exchange_ns(reps));
    return 0;
  }
  thread_counts.erase(std::unique(thread_counts.begin(), thread_counts.end()), thread_counts.end());
  std::printf(
      "# memory traffic (bytes read + written per second), best of %d; per core: the "
      "slowest of those running\n",
      reps);
  std::printf("#%11s %6s %13s %13s %13s %13s\n", "size", "cores", "memcpy/core", "update/core",
              "a+=b/core", "update, all");
  const double exchange = exchange_ns(reps);
  if (exchange > 0) {
    std::printf("# a cache line exchanged between CPUs 0 and 1: %.1f ns (best of %d)\n", exchange,
                reps);
  }
  std::string rows;
  for (uint64_t s : sizes) {
    for (int t : thread_counts) {
      const double copy = traffic(Kernel::kCopy, s) / measure(Kernel::kCopy, s, t, reps) / 1e9;
      const double update =
          traffic(Kernel::kUpdate, s) / measure(Kernel::kUpdate, s, t, reps) / 1e9;
      const double add = traffic(Kernel::kAdd, s) / measure(Kernel::kAdd, s, t, reps) / 1e9;
      std::printf("%12s %6d %10.2f GB/s %8.2f GB/s %8.2f GB/s %8.2f GB/s\n", size_text(s).c_str(),
                  t, copy, update, add, update * t);
      char row[320];
      std::snprintf(row, sizeof(row),
                    "%s{\"size_bytes\": %llu, \"cores\": %d, \"memcpy_gbps\": %.3f, "
                    "\"update_gbps\": %.3f, \"add_gbps\": %.3f, \"update_all_gbps\": %.3f}",
                    rows.empty() ? "" : ", ", static_cast<unsigned long long>(s), t, copy, update,
                    add, update * t);
      rows += row;
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"config\": {\"tool\": \"tutti-membw\", \"reps\": " << reps << "}, ";
    if (exchange > 0) out << "\"exchange_ns\": " << exchange << ", ";
    out << "\"rows\": [" << rows << "]}\n";
    if (!out) {
      std::fprintf(stderr, "tutti-membw: cannot write %s\n", json.c_str());
      return 1;
    }
  }
  return 0;
}
