// tutti-bench --op transfer: the direct transport between two processes. Rank 0 publishes one
// tensor per size (from its shareable memory for shm, so gets and borrows can be zero-copy
// reads, unless --source heap: ordinary memory, read across processes); rank 1 resolves the
// reference and times, per size:
//   cold    the first get (or borrow): connecting, mapping the owner's block
//   time    warm gets into a ready buffer (--mode copy), or borrow + read one byte + release
//           (--mode borrow): median and p99
//   staged  (--baseline) what a direct transport avoids: the owner serialises into a host buffer
//           and writes it to a Unix socket, the consumer reads it and deserialises into its
//           buffer
//   memcpy  a same-size memcpy in the consumer (the copy's ceiling)
//   p2p     (--transport gloo) the same bytes over tutti's own send/recv on a Gloo group of the
//           two ranks, asked for the same way (rank 1 sends a 1-byte request, rank 0 answers
//           with the tensor): what a two-sided get adds to the collective library's p2p
// Before the sweep rank 0 times a put of 1000 tensors of 200 KB of its shareable memory.
// --transport cuda_ipc: GPU tensors on device 0 of both ranks; staged is D2H, the socket and
// H2D, and memcpy an in-process device-to-device copy of the same size.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_math.h"
#include "tutti/transfer_agent.h"
#include "tutti/tutti.h"

#if TUTTI_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

uint8_t pattern(uint64_t i) {
  return static_cast<uint8_t>((i * 7 + 3) & 0xff);
}

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
    if (w <= 0)
      throw Error(ErrorCode::kIoError, std::string("staged write: ") + std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void full_read(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0)
      throw Error(ErrorCode::kIoError, std::string("staged read: ") + std::strerror(errno));
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

// Device memory for --transport cuda_ipc (host memory otherwise).
struct Buffer {
  bool cuda = false;
  std::vector<uint8_t> host;
  void* device = nullptr;
  Buffer(bool on_gpu, size_t bytes, uint8_t fill) : cuda(on_gpu) {
#if TUTTI_BENCH_CUDA
    if (cuda) {
      if (cudaMalloc(&device, std::max<size_t>(bytes, 1)) != cudaSuccess) {
        throw Error(ErrorCode::kUnavailable, "tutti-bench: cudaMalloc of " + std::to_string(bytes));
      }
      cudaMemset(device, fill, bytes);
      cudaDeviceSynchronize();
      return;
    }
#endif
    host.assign(bytes, fill);
  }
  ~Buffer() {
#if TUTTI_BENCH_CUDA
    if (device != nullptr) cudaFree(device);
#endif
  }
  void* data() {
    return cuda ? device : host.data();
  }
  TensorView view(size_t bytes) {
    return TensorView(data(), DType::kUInt8, {static_cast<int64_t>(bytes)},
                      cuda ? Device::cuda(0) : Device::cpu());
  }
};

// Copies between host and (for cuda) device memory, synchronously.
void copy_bytes(void* dst, const void* src, size_t bytes, bool cuda) {
#if TUTTI_BENCH_CUDA
  if (cuda) {
    cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    cudaDeviceSynchronize();  // (device-to-device cudaMemcpy does not wait on the host)
    return;
  }
#endif
  (void)cuda;
  std::memcpy(dst, src, bytes);
}

struct TransferRow {
  uint64_t bytes = 0;
  double cold_us = 0, time_us = 0, p99_us = 0, staged_us = -1, memcpy_us = 0, p2p_us = -1;
  int64_t wrong = 0;
};

}  // namespace

int run_transfer_bench(const Config& c, CollectiveGroup& meta) {
  if (meta.world_size() != 2) {
    if (meta.rank() == 0)
      std::fprintf(stderr, "tutti-bench: --op transfer runs on 2 ranks (--ranks 2)\n");
    return 2;
  }
  const bool owner = meta.rank() == 0;
  const bool shm = c.transport == "shm" || c.transport == "auto";
  const bool cuda = c.transport == "cuda_ipc";
#if !TUTTI_BENCH_CUDA
  if (cuda) {
    if (owner) std::fprintf(stderr, "tutti-bench: built without CUDA: no --transport cuda_ipc\n");
    return 2;
  }
#endif
  TransferAgentOptions ao;
  ao.name = owner ? "bench-owner" : "bench-consumer";
  // Transports that reach other hosts: the owner's agent serves them over TCP (its leases, and
  // the socket transport's bytes).
  ao.listen_tcp = c.transport == "socket" || c.transport == "ucx";
  auto agent = TransferAgent::create(ao);
  const std::string job = std::getenv("TUTTI_JOB_ID") ? std::getenv("TUTTI_JOB_ID") : "local";
  const int reps = c.warmup + c.iters;
  // Two-sided transports: the agents' dedicated group, and a plain group for the p2p baseline.
  const bool two_sided = c.transport == "gloo" || c.transport == "nccl";
  std::shared_ptr<CollectiveGroup> p2p;
  if (two_sided) {
    GroupOptions go;
    go.store_url = "env://";
    go.timeout = std::chrono::minutes(2);
    agent->join_group(c.transport, 2, meta.rank(), go, "tutti-bench");
    p2p = CollectiveGroup::create(2, meta.rank(), c.transport, "tutti-bench-p2p", go);
  }

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

  // A put of 1000 tensors of 200 KB (views into one shareable block, then into registered memory).
  double put_us = -1, registered_put_us = -1, register_us = -1;
  if (owner && shm) {
    const size_t each = 200 * 1000;
    TensorView block = agent->allocate(each * 1000);
    std::memset(block.data(), 1, block.nbytes());
    std::vector<TensorView> views;
    for (int i = 0; i < 1000; ++i)
      views.push_back(block.slice(static_cast<int64_t>(i * each), each));
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
    // The same from the application's memory, registered once (register_memory with its memfd).
    const int fd = ::memfd_create("bench-registered", MFD_CLOEXEC);
    void* mem = MAP_FAILED;
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(each * 1000)) == 0) {
      mem = ::mmap(nullptr, each * 1000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (mem != MAP_FAILED) {
      std::memset(mem, 2, each * 1000);
      TensorView region(mem, DType::kUInt8, {static_cast<int64_t>(each * 1000)});
      const auto r0 = Clock::now();
      agent->register_memory(region, fd);
      register_us = us_since(r0);
      views.clear();
      for (int i = 0; i < 1000; ++i)
        views.push_back(region.slice(static_cast<int64_t>(i * each), each));
      t.clear();
      for (int r = 0; r < 20; ++r) {
        const auto t0 = Clock::now();
        ObjectHandle h = agent->put(views);
        t.push_back(us_since(t0));
        h.release();
      }
      agent->wait_tensor_freed(region, std::chrono::seconds(10));
      agent->unregister_memory(region);
      ::munmap(mem, each * 1000);
      registered_put_us = quantile(t, 0.5);
    }
    if (fd >= 0) ::close(fd);
  }
  // Over a transport that registers memory (ucx, a plugin): the same 1000 views of one buffer,
  // the first put (one registration) and the next ones (the registration cached).
  double ucx_first_us = -1, ucx_put_us = -1;
  if (owner && c.transport == "ucx") {
    const size_t each = 200 * 1000;
    std::vector<uint8_t> buffer(each * 1000, 3);
    TensorView region(buffer.data(), DType::kUInt8, {static_cast<int64_t>(buffer.size())});
    std::vector<TensorView> views;
    for (int i = 0; i < 1000; ++i)
      views.push_back(region.slice(static_cast<int64_t>(i * each), each));
    PutOptions po;
    po.transport = "ucx";
    auto t0 = Clock::now();
    ObjectHandle first = agent->put(views, po);
    ucx_first_us = us_since(t0);
    std::vector<double> t;
    for (int r = 0; r < 20; ++r) {
      t0 = Clock::now();
      ObjectHandle h = agent->put(views, po);
      t.push_back(us_since(t0));
      h.release();
    }
    first.release();
    agent->wait_tensor_freed(region, std::chrono::seconds(10));
    ucx_put_us = quantile(t, 0.5);
  }
  ucx_first_us = share_number(meta, ucx_first_us);
  ucx_put_us = share_number(meta, ucx_put_us);
  put_us = share_number(meta, put_us);
  registered_put_us = share_number(meta, registered_put_us);
  register_us = share_number(meta, register_us);

  if (!owner) {
    std::printf(
        "# tutti-bench %s: transfer, transport %s, mode %s, source %s, rank 0 (owner) -> rank 1\n",
        tutti::version(), c.transport.c_str(), c.borrow ? "borrow" : "copy",
        shm && !c.heap_source ? "shareable" : "heap");
    std::printf("# warmup %d, iters %d, check %d%s\n", c.warmup, c.iters, c.check ? 1 : 0,
                c.baseline ? ", baseline staged (serialise, Unix socket, deserialise)" : "");
    if (ucx_put_us >= 0) {
      std::printf(
          "# put of 1000 views x 200 KB of one buffer over ucx: first %.1f us (it registers "
          "the buffer), then %.1f us (median of 20)\n",
          ucx_first_us, ucx_put_us);
    }
    if (put_us >= 0) {
      std::printf("# put of 1000 tensors x 200 KB of allocate()d memory: %.1f us (median of 20)\n",
                  put_us);
    }
    if (registered_put_us >= 0) {
      std::printf(
          "# put of 1000 tensors x 200 KB of registered memory (a memfd): %.1f us (median "
          "of 20; register_memory once: %.1f us)\n",
          registered_put_us, register_us);
    }
    if (two_sided) {
      std::printf(
          "# p2p: tutti's own send/recv of the same bytes on a %s group, asked for with a "
          "1-byte send (t/p2p: what the direct transport costs on top)\n",
          c.transport.c_str());
    }
    std::printf("# %10s %10s %10s %10s %8s %6s %11s %8s %10s %8s%s\n", "size", "cold", "time",
                "p99", "GB/s", "#wrong", "staged", "staged/t", "memcpy", "memcpy/t",
                two_sided ? "        p2p    t/p2p" : "");
    std::printf("# %10s %10s %10s %10s %8s %6s %11s %8s %10s %8s%s\n", "(B)", "(us)", "(us)",
                "(us)", "", "", "(us)", "", "(us)", "", two_sided ? "       (us)         " : "");
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
    std::unique_ptr<Buffer> gpu_source;
    if (owner) {
      if (shm && !c.heap_source) {
        source = agent->allocate(bytes);
      } else {
        heap.resize(bytes);
        source = TensorView(heap);
      }
      uint8_t* p = static_cast<uint8_t*>(source.data());
      for (uint64_t i = 0; i < bytes; ++i) p[i] = pattern(i);
      if (cuda) {
        gpu_source = std::make_unique<Buffer>(true, bytes, 0);
        copy_bytes(gpu_source->data(), heap.data(), bytes, true);
        source = gpu_source->view(bytes);
      }
      PutOptions po;
      po.transport = c.transport;
      handle = agent->put({source}, po);
      ref_text = handle.ref().to_text();
    }
    ref_text = share(meta, ref_text);
    if (owner) {
      if (two_sided) {
        // The p2p baseline's answers, while the consumer alternates gets and p2p requests (the
        // agent serves gets from its own threads meanwhile).
        std::vector<uint8_t> ask(1);
        for (int r = 0; r < reps; ++r) {
          p2p->recv(TensorView(ask), 1);
          p2p->send(source, 1);
        }
      }
      meta.barrier();  // the consumer timed its gets
      if (c.baseline) {
        std::vector<uint8_t> buffer(bytes);
        for (int r = 0; r < reps; ++r) {
          char ask;
          full_read(staged, &ask, 1);
          copy_bytes(buffer.data(), source.data(), bytes, cuda);  // serialise (D2H for GPU)
          const uint64_t n = bytes;
          full_write(staged, &n, sizeof(n));
          full_write(staged, buffer.data(), bytes);
        }
      }
      meta.barrier();
      handle.release();
      agent->wait_tensor_freed(source, std::chrono::seconds(30));
      if (shm && !c.heap_source) agent->deallocate(source);
      gpu_source.reset();
      continue;
    }
    const TensorRef ref = TensorRef::from_text(ref_text);
    Buffer target_buffer(cuda, bytes, 0), local(cuda, bytes, 1);
    std::vector<uint8_t> host_copy;
    GetOptions go;
    go.targets = {target_buffer.view(bytes)};
    std::vector<double> t;
    auto once = [&] {
      if (c.borrow) {
        Borrowed b = agent->borrow(ref);
        if (!cuda) {
          volatile uint8_t x = static_cast<const uint8_t*>(b.tensors()[0].data())[bytes - 1];
          (void)x;
        }
      } else {
        agent->get(ref, go);
      }
    };
    auto t0 = Clock::now();
    once();
    row.cold_us = us_since(t0);
    std::vector<double> t_p2p;
    std::vector<uint8_t> ask(1, 1);
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      once();
      if (r >= c.warmup) t.push_back(us_since(t0));
      if (two_sided) {
        // Alternating with the gets, so that both see the same load on a shared machine.
        t0 = Clock::now();
        p2p->send(TensorView(ask), 0);
        p2p->recv(local.view(bytes), 0);  // not the target: the check below reads the get
        if (r >= c.warmup) t_p2p.push_back(us_since(t0));
      }
    }
    row.time_us = quantile(t, 0.5);
    row.p99_us = quantile(t, 0.99);
    if (two_sided) row.p2p_us = quantile(t_p2p, 0.5);
    if (c.check) {
      Borrowed b;
      const uint8_t* got = static_cast<const uint8_t*>(target_buffer.data());
      if (c.borrow) {
        b = agent->borrow(ref);
        got = static_cast<const uint8_t*>(b.tensors()[0].data());
      }
      if (cuda) {
        host_copy.resize(bytes);
        copy_bytes(host_copy.data(), got, bytes, true);
        got = host_copy.data();
      }
      for (uint64_t i = 0; i < bytes; ++i) row.wrong += got[i] != pattern(i);
    }
    t.clear();
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      copy_bytes(target_buffer.data(), local.data(), bytes, cuda);  // D2D for GPU
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
        copy_bytes(target_buffer.data(), buffer.data(), n, cuda);  // deserialise (H2D for GPU)
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
    const std::string p2p_text =
        two_sided ? num(row.p2p_us, " %10.2f") + num(row.time_us / row.p2p_us, " %8.3f") : "";
    std::printf("  %10llu %10.1f %10.2f %10.2f %8.3f %6lld %11s %8s %10.2f %8.2f%s\n",
                static_cast<unsigned long long>(bytes), row.cold_us, row.time_us, row.p99_us,
                row.time_us > 0 ? bytes / row.time_us / 1e3 : 0.0,
                static_cast<long long>(row.wrong),
                row.staged_us >= 0 ? num(row.staged_us, "%11.2f").c_str() : "        N/A",
                row.staged_us >= 0 ? num(row.staged_us / row.time_us, "%8.1f").c_str() : "     N/A",
                row.memcpy_us, row.memcpy_us / row.time_us, p2p_text.c_str());
    std::fflush(stdout);
  }
  if (!owner) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong == 0 ? "OK" : "FAILED");
    if (!c.json.empty()) {
      std::ofstream out(c.json);
      out << "{\"config\": {\"op\": \"transfer\", \"transport\": \"" << c.transport
          << "\", \"mode\": \"" << (c.borrow ? "borrow" : "copy") << "\", \"source\": \""
          << (shm && !c.heap_source ? "shareable" : "heap") << "\", \"warmup\": " << c.warmup
          << ", \"iters\": " << c.iters << ", \"put_1000x200KB_us\": " << put_us
          << ", \"put_1000x200KB_registered_us\": " << registered_put_us << "},\n  \"rows\": [\n";
      for (size_t i = 0; i < rows.size(); ++i) {
        const TransferRow& r = rows[i];
        out << "    {\"bytes\": " << r.bytes << ", \"cold_us\": " << r.cold_us
            << ", \"time_us\": " << r.time_us << ", \"p99_us\": " << r.p99_us
            << ", \"staged_us\": " << r.staged_us << ", \"memcpy_us\": " << r.memcpy_us
            << ", \"p2p_us\": " << r.p2p_us << ", \"wrong\": " << r.wrong << "}"
            << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }
    std::fflush(stdout);
  }
  if (staged >= 0) ::close(staged);
  if (p2p) p2p->destroy();
  std::vector<int64_t> wrong = {total_wrong};
  meta.allreduce(TensorView(wrong));
  return wrong[0] == 0 ? 0 : 1;
}

}  // namespace tutti::bench
