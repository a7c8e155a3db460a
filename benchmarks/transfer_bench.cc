// tutti-bench --op transfer: the direct transport between two processes. Rank 0 publishes one
// tensor per size (from its shareable memory for shm, so gets and borrows can be zero-copy
// reads); rank 1 resolves the reference and times, per size:
//   cold    the first get (or borrow): connecting, mapping the owner's block
//   time    warm gets into a ready buffer (--mode copy), or borrow + read one byte + release
//           (--mode borrow): median and p99
//   staged  (--baseline) what a direct transport avoids: the owner serialises into a host buffer
//           and writes it to a Unix socket, the consumer reads it and deserialises into its
//           buffer
//   memcpy  a same-size memcpy in the consumer (the copy's ceiling)
// Before the sweep rank 0 times a put of 1000 tensors of 200 KB of its shareable memory.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_math.h"
#include "tutti/tutti.h"
#include "tutti/transfer_agent.h"

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

uint8_t pattern(uint64_t i) { return static_cast<uint8_t>((i * 7 + 3) & 0xff); }

// Rank 0 sends `text` to the others over the meta group.
std::string share(CollectiveGroup& meta, const std::string& text) {
  std::vector<int64_t> n = {static_cast<int64_t>(text.size())};
  meta.broadcast(TensorView(n));
  std::string out = meta.rank() == 0 ? text : std::string(static_cast<size_t>(n[0]), '\0');
  if (n[0] > 0) {
    meta.broadcast(TensorView(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  }
  return out;
}

double share_number(CollectiveGroup& meta, double v) {
  std::vector<double> x = {v};
  meta.broadcast(TensorView(x));
  return x[0];
}

void full_write(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) throw Error(ErrorCode::kIoError, std::string("staged write: ") + std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void full_read(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) throw Error(ErrorCode::kIoError, std::string("staged read: ") + std::strerror(errno));
    c += r;
    n -= static_cast<size_t>(r);
  }
}

sockaddr_un staged_address(const std::string& job, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const std::string name = "tutti-bench-staged/" + job + "/" + std::to_string(::getppid());
  std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof(a.sun_path) - 2));
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                               std::min(name.size(), sizeof(a.sun_path) - 2));
  return a;
}

struct TransferRow {
  uint64_t bytes = 0;
  double cold_us = 0, time_us = 0, p99_us = 0, staged_us = -1, memcpy_us = 0;
  int64_t wrong = 0;
};

}  // namespace

int run_transfer_bench(const Config& c, CollectiveGroup& meta) {
  if (meta.world_size() != 2) {
    if (meta.rank() == 0) std::fprintf(stderr, "tutti-bench: --op transfer runs on 2 ranks (--ranks 2)\n");
    return 2;
  }
  const bool owner = meta.rank() == 0;
  const bool shm = c.transport == "shm" || c.transport == "auto";
  TransferAgentOptions ao;
  ao.name = owner ? "bench-owner" : "bench-consumer";
  auto agent = TransferAgent::create(ao);
  const std::string job = std::getenv("TUTTI_JOB_ID") ? std::getenv("TUTTI_JOB_ID") : "local";
  const int reps = c.warmup + c.iters;

  // The staged baseline's socket: the owner listens, the consumer connects.
  int staged = -1;
  if (c.baseline) {
    socklen_t len;
    sockaddr_un addr = staged_address(job, len);
    if (owner) {
      const int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::bind(l, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(l, 1) != 0) {
        throw Error(ErrorCode::kIoError, std::string("staged listen: ") + std::strerror(errno));
      }
      meta.barrier();
      staged = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      ::close(l);
    } else {
      meta.barrier();
      staged = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (::connect(staged, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        throw Error(ErrorCode::kIoError, std::string("staged connect: ") + std::strerror(errno));
      }
    }
  }

  // A put of 1000 tensors of 200 KB (views into one shareable block).
  double put_us = -1;
  if (owner && shm) {
    const size_t each = 200 * 1000;
    TensorView block = agent->allocate(each * 1000);
    std::memset(block.data(), 1, block.nbytes());
    std::vector<TensorView> views;
    for (int i = 0; i < 1000; ++i) views.push_back(block.slice(static_cast<int64_t>(i * each), each));
    std::vector<double> t;
    for (int r = 0; r < 20; ++r) {
      const auto t0 = Clock::now();
      ObjectHandle h = agent->put(views);
      t.push_back(us_since(t0));
      h.release();
    }
    agent->wait_tensor_freed(block, std::chrono::seconds(10));
    agent->deallocate(block);
    put_us = quantile(t, 0.5);
  }
  put_us = share_number(meta, put_us);

  if (!owner) {
    std::printf("# tutti-bench %s: transfer, transport %s, mode %s, rank 0 (owner) -> rank 1\n",
                tutti::version(), c.transport.c_str(), c.borrow ? "borrow" : "copy");
    std::printf("# warmup %d, iters %d, check %d%s\n", c.warmup, c.iters, c.check ? 1 : 0,
                c.baseline ? ", baseline staged (serialise, Unix socket, deserialise)" : "");
    if (put_us >= 0) {
      std::printf("# put of 1000 tensors x 200 KB of allocate()d memory: %.1f us (median of 20)\n",
                  put_us);
    }
    std::printf("# %10s %10s %10s %10s %8s %6s %11s %8s %10s %8s\n", "size", "cold", "time", "p99",
                "GB/s", "#wrong", "staged", "staged/t", "memcpy", "memcpy/t");
    std::printf("# %10s %10s %10s %10s %8s %6s %11s %8s %10s %8s\n", "(B)", "(us)", "(us)", "(us)",
                "", "", "(us)", "", "(us)", "");
  }
  std::vector<TransferRow> rows;
  int64_t total_wrong = 0;
  for (uint64_t bytes : sweep(c.min_bytes, c.max_bytes, c.factor)) {
    TransferRow row;
    row.bytes = bytes;
    std::string ref_text;
    ObjectHandle handle;
    TensorView source;
    std::vector<uint8_t> heap;
    if (owner) {
      if (shm) {
        source = agent->allocate(bytes);
      } else {
        heap.resize(bytes);
        source = TensorView(heap);
      }
      uint8_t* p = static_cast<uint8_t*>(source.data());
      for (uint64_t i = 0; i < bytes; ++i) p[i] = pattern(i);
      PutOptions po;
      po.transport = c.transport;
      handle = agent->put({source}, po);
      ref_text = handle.ref().to_text();
    }
    ref_text = share(meta, ref_text);
    if (owner) {
      meta.barrier();  // the consumer timed its gets
      if (c.baseline) {
        std::vector<uint8_t> buffer(bytes);
        for (int r = 0; r < reps; ++r) {
          char ask;
          full_read(staged, &ask, 1);
          std::memcpy(buffer.data(), source.data(), bytes);  // serialise
          const uint64_t n = bytes;
          full_write(staged, &n, sizeof(n));
          full_write(staged, buffer.data(), bytes);
        }
      }
      meta.barrier();
      handle.release();
      agent->wait_tensor_freed(source, std::chrono::seconds(30));
      if (shm) agent->deallocate(source);
      continue;
    }
    const TensorRef ref = TensorRef::from_text(ref_text);
    std::vector<uint8_t> target(bytes, 0), local(bytes, 1);
    GetOptions go;
    go.targets = {TensorView(target)};
    std::vector<double> t;
    auto once = [&] {
      if (c.borrow) {
        Borrowed b = agent->borrow(ref);
        volatile uint8_t x = static_cast<const uint8_t*>(b.tensors()[0].data())[bytes - 1];
        (void)x;
      } else {
        agent->get(ref, go);
      }
    };
    auto t0 = Clock::now();
    once();
    row.cold_us = us_since(t0);
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      once();
      if (r >= c.warmup) t.push_back(us_since(t0));
    }
    row.time_us = quantile(t, 0.5);
    row.p99_us = quantile(t, 0.99);
    if (c.check) {
      Borrowed b;
      const uint8_t* got = target.data();
      if (c.borrow) {
        b = agent->borrow(ref);
        got = static_cast<const uint8_t*>(b.tensors()[0].data());
      }
      for (uint64_t i = 0; i < bytes; ++i) row.wrong += got[i] != pattern(i);
    }
    t.clear();
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      std::memcpy(target.data(), local.data(), bytes);
      if (r >= c.warmup) t.push_back(us_since(t0));
    }
    row.memcpy_us = quantile(t, 0.5);
    meta.barrier();
    if (c.baseline) {
      std::vector<uint8_t> buffer(bytes);
      t.clear();
      for (int r = 0; r < reps; ++r) {
        t0 = Clock::now();
        const char ask = 1;
        full_write(staged, &ask, 1);
        uint64_t n = 0;
        full_read(staged, &n, sizeof(n));
        full_read(staged, buffer.data(), n);
        std::memcpy(target.data(), buffer.data(), n);  // deserialise
        if (r >= c.warmup) t.push_back(us_since(t0));
      }
      row.staged_us = quantile(t, 0.5);
    }
    meta.barrier();
    total_wrong += row.wrong;
    rows.push_back(row);
    auto num = [](double v, const char* f) {
      char b[32];
      std::snprintf(b, sizeof(b), f, v);
      return std::string(b);
    };
    std::printf("  %10llu %10.1f %10.2f %10.2f %8.3f %6lld %11s %8s %10.2f %8.2f\n",
                static_cast<unsigned long long>(bytes), row.cold_us, row.time_us, row.p99_us,
                row.time_us > 0 ? bytes / row.time_us / 1e3 : 0.0, static_cast<long long>(row.wrong),
                row.staged_us >= 0 ? num(row.staged_us, "%11.2f").c_str() : "        N/A",
                row.staged_us >= 0 ? num(row.staged_us / row.time_us, "%8.1f").c_str() : "     N/A",
                row.memcpy_us, row.memcpy_us / row.time_us);
    std::fflush(stdout);
  }
  if (!owner) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong == 0 ? "OK" : "FAILED");
    if (!c.json.empty()) {
      std::ofstream out(c.json);
      out << "{\"config\": {\"op\": \"transfer\", \"transport\": \"" << c.transport
          << "\", \"mode\": \"" << (c.borrow ? "borrow" : "copy") << "\", \"warmup\": " << c.warmup
          << ", \"iters\": " << c.iters << ", \"put_1000x200KB_us\": " << put_us
          << "},\n  \"rows\": [\n";
      for (size_t i = 0; i < rows.size(); ++i) {
        const TransferRow& r = rows[i];
        out << "    {\"bytes\": " << r.bytes << ", \"cold_us\": " << r.cold_us
            << ", \"time_us\": " << r.time_us << ", \"p99_us\": " << r.p99_us
            << ", \"staged_us\": " << r.staged_us << ", \"memcpy_us\": " << r.memcpy_us
            << ", \"wrong\": " << r.wrong << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }
    std::fflush(stdout);
  }
  if (staged >= 0) ::close(staged);
  std::vector<int64_t> wrong = {total_wrong};
  meta.allreduce(TensorView(wrong));
  return wrong[0] == 0 ? 0 : 1;
}

}  // namespace tutti::bench
