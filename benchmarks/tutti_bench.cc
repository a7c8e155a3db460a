// tutti-bench: collective benchmarks in nccl-tests' format.
//
//   tutti-bench --ranks 2 -b 8 -e 64M -f 2 -d float32 -o sum -c 1 --baseline
//
// Runs under tutti-run, torchrun, srun or mpirun (env://), or starts --ranks N local ranks
// itself through tutti-run. Rank 0 prints; every rank times every iteration locally and the
// slowest rank's time per iteration is taken after the loop, so no collective runs inside the
// timed loop.
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_math.h"
#include "raw_gloo.h"
#if TUTTI_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "raw_nccl.h"
#endif
#include "tutti/tutti.h"

using namespace tutti;
using namespace tutti::bench;
using Clock = std::chrono::steady_clock;

namespace tutti::bench {
int run_transfer_bench(const Config& c, CollectiveGroup& meta);  // transfer_bench.cc
}  // namespace tutti::bench

namespace {

constexpr const char* kUsage = R"(usage: tutti-bench [options]

Measures a collective over a sweep of message sizes, nccl-tests style.

  --op NAME        allreduce (default), allgather, reduce_scatter, broadcast, reduce,
                   sendrecv (ping-pong between ranks 0 and 1), barrier, alltoall, gather,
                   scatter, transfer (the direct transport: rank 0 publishes, rank 1 gets;
                   2 ranks)
  --transport T    transfer: shm (default), socket, or a registered transport
  --mode M         transfer: copy (default: get into a buffer) or borrow (a zero-copy view)
  --source S       transfer: what the owner puts: shareable (default for shm: its agent's
                   memory, which consumers map) or heap (ordinary memory: shm consumers read
                   it by cross-memory read; the other transports always put heap memory)
  --backend NAME   auto (default: TUTTI_BACKEND, else auto = shm on one host, hier across
                   hosts with several ranks on one, else gloo), shm, gloo, hier, nccl
  --ranks N        start N local ranks through tutti-run (else: the launcher's environment,
                   or a single rank)
  -b SIZE          smallest message (default 8); sizes take K, M, G suffixes (powers of 1024)
  -e SIZE          largest message (default 64M)
  -f FACTOR        multiply the size by this each step (default 2)
  -d DTYPE         float32 (default), float16, bfloat16, float64, int8, uint8, int32, uint32,
                   int64, uint64, bool
  -o REDOP         sum (default), prod, min, max, avg
  -r ROOT          root rank of broadcast, reduce, gather and scatter (default 0)
  -w N             warm-up iterations per size (default 5)
  -n N             timed iterations per size (default 20)
  -T MS            a time budget per size instead of -n (rank 0 sizes the iterations)
  -c 0|1           check results (default 1)
  --baseline       also run each size straight on the library underneath (raw Gloo for gloo
                   and shm, raw NCCL for nccl) and print tutti/raw time ratios: interleaved in
                   blocks of 5 iterations like for like, after tutti's iterations for shm.
                   transfer: the staged path instead (serialise, Unix socket, deserialise)
  --symmetric      the op's buffers in the group's symmetric memory
                   (CollectiveGroup::allocate_symmetric; shm: single-copy collectives)
  --async          allreduce only: also measure overlap. Per size: the op alone (t_op), a
                   compute loop sized to take as long (t_comp), and the op issued with
                   async_op while the caller computes, then waited for (t_both); hidden =
                   (t_op + t_comp - t_both) / t_op, the fraction of the op the compute hid
  --json FILE      write {"config": {...}, "rows": [...]} to FILE
  --csv FILE       write the rows as CSV to FILE
  -h, --help       this text

Sizes follow nccl-tests: for allgather, reduce_scatter, alltoall, gather and scatter the size is
the whole buffer of world-size blocks. busbw = algbw x factor: allreduce 2(n-1)/n; allgather,
reduce_scatter, alltoall, gather and scatter (n-1)/n; broadcast, reduce and sendrecv 1. Times are the median (and p99) over iterations of the slowest
rank's time.
)";

// One measured row: a size and a placement.
struct Row {
  uint64_t bytes = 0;
  int64_t count = 0;
  bool in_place = false;
  double time_us = 0;
  double p99_us = 0;
  double mean_us = 0;  // what the iterations took together, per iteration (a job's throughput)
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = 0;
  double baseline_us = -1;  // < 0: none
  // --async: the compute loop alone, the op issued async while it runs then waited for, and the
  // fraction of the op it hid (< 0: not measured).
  double compute_us = -1;
  double overlapped_us = -1;
  double hidden = -1;
};

// Work for the caller while an async op runs: arithmetic on registers only, so it competes for
// a core but not for memory bandwidth. Returns a value the compiler must keep.
double compute(int64_t iterations) {
  double x = 1.0, y = 0.5;
  for (int64_t i = 0; i < iterations; ++i) {
    x = x * 1.0000001 + 1e-9;
    y = y * 0.9999999 + x * 1e-12;
  }
  return x + y;
}

volatile double g_sink = 0;

// The value rank r contributes at element i, chosen so every reduction is exact in every dtype.
double input_value(const Config& c, int r, int64_t i) {
  if (c.dtype == DType::kBool) return (i + r) % 2;
  if (c.redop == ReduceOp::kProduct) return (r == 0 && i % 3 == 0) ? 2.0 : 1.0;
  return static_cast<double>((i * 7 + r * 3) % 5 + 1);
}

double reduced_value(const Config& c, int world, int64_t i) {
  double acc = input_value(c, 0, i);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(c, r, i);
    if (c.dtype == DType::kBool) {
      acc = (c.redop == ReduceOp::kSum || c.redop == ReduceOp::kMax) ? (acc || v) : (acc && v);
    } else if (c.redop == ReduceOp::kProduct) {
      acc *= v;
    } else if (c.redop == ReduceOp::kMin) {
      acc = std::min(acc, v);
    } else if (c.redop == ReduceOp::kMax) {
      acc = std::max(acc, v);
    } else {
      acc += v;
    }
  }
  return c.redop == ReduceOp::kAvg ? acc / world : acc;
}

void write_value(DType d, void* p, int64_t i, double v) {
  switch (d) {
    case DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0; break;
    case DType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kUInt32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); break;
    case DType::kFloat16: static_cast<Float16*>(p)[i] = to_float16(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<BFloat16*>(p)[i] = to_bfloat16(static_cast<float>(v)); break;
    case DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kFloat64: static_cast<double*>(p)[i] = v; break;
  }
}

double read_value(DType d, const void* p, int64_t i) {
  switch (d) {
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] != 0;
    case DType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DType::kUInt32: return static_cast<const uint32_t*>(p)[i];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kUInt64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DType::kFloat16: return to_float(static_cast<const Float16*>(p)[i]);
    case DType::kBFloat16: return to_float(static_cast<const BFloat16*>(p)[i]);
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kFloat64: return static_cast<const double*>(p)[i];
  }
  return 0;
}

// Relative tolerance of an average (the only inexact result): a few units in the last place.
double tolerance(DType d) {
  switch (d) {
    case DType::kFloat16: return 2e-3;
    case DType::kBFloat16: return 1.6e-2;
    case DType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

std::string self_path() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// --ranks N: re-run this command under tutti-run (found next to this program), without --ranks.
int relaunch(int argc, char** argv, const Config& c) {
  const std::string self = self_path();
  const std::string dir = self.substr(0, self.rfind('/'));
  std::string launcher = dir + "/tutti-run";
  if (access(launcher.c_str(), X_OK) != 0) launcher = "tutti-run";  // from PATH
  std::vector<std::string> args = {launcher,      "-n", std::to_string(c.ranks),
                                   "--no-prefix", "--", self};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--ranks") {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  std::vector<char*> ptrs;
  for (auto& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  execvp(ptrs[0], ptrs.data());
  std::fprintf(stderr, "tutti-bench: cannot run %s: %s\n", launcher.c_str(), std::strerror(errno));
  return 127;
}

class Bench {
 public:
  // `group` runs the measured ops; `meta`, a CPU group of the same ranks, combines timings and
  // counts on the host (outside the timed loop), whatever device `group` works on.
  Bench(std::shared_ptr<CollectiveGroup> group, std::shared_ptr<CollectiveGroup> meta,
        const Config& config)
      : g_(std::move(group)),
        meta_(std::move(meta)),
        c_(config),
        n_(g_->world_size()),
        rank_(g_->rank()) {}

  // `like_for_like`: the baseline is the library this backend itself drives.
  void set_baseline(std::unique_ptr<Baseline> raw, bool like_for_like) {
    raw_ = std::move(raw);
    like_for_like_ = like_for_like;
  }

  // CUDA tensors (the nccl backend): buffers live on `device`, mirrored on the host for filling
  // and checking, and each op is timed to its completion (blocking).
  void use_gpu(int device) {
    gpu_ = true;
    device_ = device;
  }

  bool has_out_of_place() const {
    return c_.op == BenchOp::kAllgather || c_.op == BenchOp::kReduceScatter ||
           c_.op == BenchOp::kSendRecv || c_.op == BenchOp::kBarrier ||
           c_.op == BenchOp::kAlltoall || c_.op == BenchOp::kGather || c_.op == BenchOp::kScatter;
  }
  bool has_in_place() const {
    return c_.op != BenchOp::kSendRecv && c_.op != BenchOp::kBarrier &&
           c_.op != BenchOp::kAlltoall && c_.op != BenchOp::kGather && c_.op != BenchOp::kScatter;
  }

  Row measure(uint64_t target_bytes, bool in_place) {
    const size_t es = dtype_size(c_.dtype);
    Row row;
    const int64_t per_rank = elements_per_rank(c_.op, target_bytes, es, n_);
    row.bytes = message_bytes(c_.op, per_rank, es, n_);
    row.count = static_cast<int64_t>(row.bytes / es);
    row.in_place = in_place;
    reserve(per_rank);
    fill(per_rank);

    for (int i = 0; i < c_.warmup; ++i) run(per_rank, in_place);
    int iters = c_.iters;
    if (c_.time_budget_ms > 0) iters = agree_on_iterations(per_rank, in_place);

    std::vector<double> times(static_cast<size_t>(iters));
    std::vector<double> raw_times(raw_ ? static_cast<size_t>(iters) : 0);
    // Like for like (gloo with raw Gloo, nccl with raw NCCL): interleaved in blocks of 5, so
    // both see the same conditions over the run (alternating every single iteration wakes a cold
    // event-loop thread each time, a scheduler tick on 2 cores). A different transport (shm
    // against raw Gloo) runs all of a size's iterations after tutti's: interleaved, the two
    // fight over the cores and each measures the other's threads.
    const int block = like_for_like_ ? 5 : iters;
    for (int done = 0; done < iters; done += block) {
      const int end = std::min(iters, done + block);
      for (int i = done; i < end; ++i) {
        const auto t0 = Clock::now();
        run(per_rank, in_place);
        times[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      }
      if (!raw_) continue;
      for (int i = done; i < end; ++i) {
        const auto t0 = Clock::now();
        raw_->run(base(in_), base(out_), base(scratch_), per_rank, in_place);
        raw_times[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      }
    }
    // After the loop: the slowest rank's time per iteration.
    slowest(times);
    if (raw_) slowest(raw_times);
    row.time_us = quantile(times, 0.5);
    row.p99_us = quantile(times, 0.99);
    row.mean_us = mean(times);
    if (raw_) row.baseline_us = quantile(raw_times, 0.5);
    row.algbw = row.time_us > 0 ? static_cast<double>(row.bytes) / row.time_us / 1e3 : 0;
    row.busbw = row.algbw * bus_factor(c_.op, n_);
    if (c_.op == BenchOp::kBarrier) row.algbw = row.busbw = 0;
    if (c_.async) measure_overlap(per_rank, in_place, row, iters);
    if (c_.check) row.wrong = check(per_rank, in_place);
    return row;
  }

 private:
  // --async: t_comp, t_both and the hidden fraction (see the usage text), slowest rank per
  // iteration as for t_op.
  void measure_overlap(int64_t per_rank, bool in_place, Row& row, int iters) {
    // Loop iterations per microsecond, measured here, then agreed on (the slowest rank's).
    const auto t0 = Clock::now();
    g_sink = compute(2000000);
    std::vector<double> rate = {
        2000000 /
        std::max(1e-3, std::chrono::duration<double, std::micro>(Clock::now() - t0).count())};
    AllreduceOptions slowest_rate;
    slowest_rate.reduce_op = ReduceOp::kMin;
    meta_->allreduce(TensorView(rate), slowest_rate);
    const auto work = static_cast<int64_t>(rate[0] * row.time_us);
    std::vector<double> alone(static_cast<size_t>(iters)), both(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      const auto a = Clock::now();
      g_sink = compute(work);
      alone[i] = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
      const auto b = Clock::now();
      AllreduceOptions o;
      o.reduce_op = c_.redop;
      o.async_op = true;
      auto op = g_->allreduce(view(out_, per_rank), o);
      g_sink = compute(work);
      op->wait();
      both[i] = std::chrono::duration<double, std::micro>(Clock::now() - b).count();
    }
    (void)in_place;
    slowest(alone);
    slowest(both);
    row.compute_us = quantile(alone, 0.5);
    row.overlapped_us = quantile(both, 0.5);
    row.hidden =
        row.time_us > 0
            ? std::clamp((row.time_us + row.compute_us - row.overlapped_us) / row.time_us, 0.0, 1.0)
            : 0.0;
  }

  void reserve(int64_t per_rank) {
    const size_t es = dtype_size(c_.dtype);
    const size_t one = static_cast<size_t>(per_rank) * es + 8;
    const size_t all = one * static_cast<size_t>(n_) + 8;
    // Grown once to the largest size and reused: first-touch page faults stay out of the loop.
    if (in_.size() < all) in_.resize(all);
    if (out_.size() < all) out_.resize(all);
    if (scratch_.size() < all) scratch_.resize(all);
    // Collective: every rank grows them at the same sizes.
    if (c_.symmetric && !gpu_ && (!sym_out_ || sym_out_->size() < all)) {
      sym_in_.reset();
      sym_out_.reset();
      sym_in_ = g_->allocate_symmetric(all);
      sym_out_ = g_->allocate_symmetric(all);
    }
#if TUTTI_BENCH_CUDA
    if (gpu_ && device_bytes_ < all) {
      for (char*& p : {std::ref(d_in_), std::ref(d_out_), std::ref(d_scratch_)}) {
        if (p != nullptr) cudaFree(p);
        if (cudaMalloc(reinterpret_cast<void**>(&p), all) != cudaSuccess) {
          throw Error(ErrorCode::kUnavailable,
                      "tutti-bench: cudaMalloc of " + std::to_string(all) + " bytes failed");
        }
      }
      device_bytes_ = all;
    }
#endif
  }

  // --symmetric: the twin in symmetric memory an op works on instead of `buf` (in_ or out_).
  SymmetricMemory* symmetric_twin(const std::vector<char>& buf) const {
    if (&buf == &in_) return sym_in_.get();
    if (&buf == &out_) return sym_out_.get();
    return nullptr;
  }

  // The buffer an op works on: the host vector, its device twin or its twin in symmetric memory.
  char* base(std::vector<char>& buf) {
    if (SymmetricMemory* twin = symmetric_twin(buf)) return static_cast<char*>(twin->data());
#if TUTTI_BENCH_CUDA
    if (gpu_) return &buf == &in_ ? d_in_ : &buf == &out_ ? d_out_ : d_scratch_;
#endif
    return buf.data();
  }

  // Host -> device (before an op) and device -> host (after it) for the GPU case.
  void upload(std::vector<char>& buf) {
    if (SymmetricMemory* twin = symmetric_twin(buf))
      std::memcpy(twin->data(), buf.data(), buf.size());
#if TUTTI_BENCH_CUDA
    if (gpu_) cudaMemcpy(base(buf), buf.data(), device_bytes_, cudaMemcpyHostToDevice);
#else
    (void)buf;
#endif
  }
  void download(std::vector<char>& buf) {
    if (SymmetricMemory* twin = symmetric_twin(buf))
      std::memcpy(buf.data(), twin->data(), buf.size());
#if TUTTI_BENCH_CUDA
    if (gpu_) cudaMemcpy(buf.data(), base(buf), device_bytes_, cudaMemcpyDeviceToHost);
#else
    (void)buf;
#endif
  }

  // Inputs for the check; also the data the timed loop runs on.
  void fill(int64_t per_rank) {
    const int64_t total =
        (is_blocked(c_.op) && c_.op != BenchOp::kGather) ? per_rank * n_ : per_rank;
    for (int64_t i = 0; i < total; ++i) {
      if (c_.op == BenchOp::kAllgather) {
        if (i < per_rank) write_value(c_.dtype, in_.data(), i, input_value(c_, rank_, i));
      } else {
        write_value(c_.dtype, in_.data(), i, input_value(c_, rank_, i));
      }
    }
    upload(in_);
  }

  TensorView view(std::vector<char>& buf, int64_t count, int64_t offset = 0) {
    return TensorView(base(buf) + offset * static_cast<int64_t>(dtype_size(c_.dtype)), c_.dtype,
                      {count}, gpu_ ? Device::cuda(device_) : Device::cpu());
  }

  void run(int64_t per_rank, bool in_place) {
    switch (c_.op) {
      case BenchOp::kAllreduce: {
        AllreduceOptions o;
        o.reduce_op = c_.redop;
        o.blocking = gpu_;
        g_->allreduce(view(out_, per_rank), o);
        break;
      }
      case BenchOp::kBroadcast: {
        BroadcastOptions o;
        o.root_rank = c_.root;
        o.blocking = gpu_;
        g_->broadcast(view(out_, per_rank), o);
        break;
      }
      case BenchOp::kReduce: {
        ReduceOptions o;
        o.root_rank = c_.root;
        o.reduce_op = c_.redop;
        o.blocking = gpu_;
        g_->reduce(view(out_, per_rank), o);
        break;
      }
      case BenchOp::kAllgather: {
        AllgatherOptions o;
        o.blocking = gpu_;
        if (in_place) {
          g_->allgather(view(out_, per_rank * n_), view(out_, per_rank, per_rank * rank_), o);
        } else {
          g_->allgather(view(out_, per_rank * n_), view(in_, per_rank), o);
        }
        break;
      }
      case BenchOp::kReduceScatter: {
        ReduceScatterOptions o;
        o.reduce_op = c_.redop;
        o.blocking = gpu_;
        if (in_place) {
          g_->reduce_scatter(view(out_, per_rank, per_rank * rank_), view(out_, per_rank * n_), o);
        } else {
          g_->reduce_scatter(view(out_, per_rank), view(in_, per_rank * n_), o);
        }
        break;
      }
      case BenchOp::kSendRecv: {
        SendOptions so;
        so.blocking = gpu_;
        RecvOptions ro;
        ro.blocking = gpu_;
        if (rank_ == 0) {
          g_->send(view(in_, per_rank), 1, so);
          g_->recv(view(out_, per_rank), 1, ro);
        } else if (rank_ == 1) {
          g_->recv(view(out_, per_rank), 0, ro);
          g_->send(view(in_, per_rank), 0, so);
        }
        break;
      }
      case BenchOp::kBarrier: g_->barrier(); break;
      case BenchOp::kAlltoall: {
        AlltoallOptions o;
        o.blocking = gpu_;
        g_->alltoall(view(out_, per_rank * n_), view(in_, per_rank * n_), o);
        break;
      }
      case BenchOp::kGather: {
        GatherOptions o;
        o.root_rank = c_.root;
        o.blocking = gpu_;
        g_->gather(view(out_, rank_ == c_.root ? per_rank * n_ : 0), view(in_, per_rank), o);
        break;
      }
      case BenchOp::kScatter: {
        ScatterOptions o;
        o.root_rank = c_.root;
        o.blocking = gpu_;
        g_->scatter(view(out_, per_rank), view(in_, rank_ == c_.root ? per_rank * n_ : 0), o);
        break;
      }
    }
  }

  // Element-wise max over ranks: each iteration's slowest rank.
  void slowest(std::vector<double>& times) {
    AllreduceOptions o;
    o.reduce_op = ReduceOp::kMax;
    meta_->allreduce(TensorView(times.data(), times.size()), o);
    if (c_.op == BenchOp::kSendRecv) {
      for (double& t : times) t /= 2;  // a round trip is two one-way messages
    }
  }

  int agree_on_iterations(int64_t per_rank, bool in_place) {
    const auto t0 = Clock::now();
    run(per_rank, in_place);
    std::vector<double> probe = {
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count()};
    AllreduceOptions o;
    o.reduce_op = ReduceOp::kMax;
    meta_->allreduce(TensorView(probe), o);
    return static_cast<int>(std::clamp(c_.time_budget_ms / std::max(probe[0], 1e-3), 1.0, 1e6));
  }

  // Runs the op once on fresh inputs and counts wrong elements over all ranks.
  int64_t check(int64_t per_rank, bool in_place) {
    const DType d = c_.dtype;
    int64_t wrong = 0;
    auto expect = [&](const void* buf, int64_t i, double want) {
      const double got = read_value(d, buf, i);
      const double tol = c_.redop == ReduceOp::kAvg ? tolerance(d) * std::fabs(want) : 0;
      if (std::fabs(got - want) > tol) ++wrong;
    };
    fill(per_rank);
    switch (c_.op) {
      case BenchOp::kAllreduce:
      case BenchOp::kBroadcast:
      case BenchOp::kReduce:
        for (int64_t i = 0; i < per_rank; ++i)
          write_value(d, out_.data(), i, input_value(c_, rank_, i));
        break;
      case BenchOp::kAllgather:
        if (in_place) {
          for (int64_t i = 0; i < per_rank; ++i) {
            write_value(d, out_.data(), per_rank * rank_ + i, input_value(c_, rank_, i));
          }
        }
        break;
      case BenchOp::kReduceScatter:
        if (in_place) std::memcpy(out_.data(), in_.data(), per_rank * n_ * dtype_size(d));
        break;
      default: break;
    }
    upload(in_);
    upload(out_);
    run(per_rank, in_place);
    download(out_);
    const char* result = out_.data();
    if (c_.corrupt_rank == rank_ && per_rank > 0) {
      write_value(d, out_.data(), 0, read_value(d, out_.data(), 0) + 1);
    }
    switch (c_.op) {
      case BenchOp::kAllreduce:
        for (int64_t i = 0; i < per_rank; ++i) expect(result, i, reduced_value(c_, n_, i));
        break;
      case BenchOp::kReduce:
        for (int64_t i = 0; i < per_rank; ++i) {
          expect(result, i,
                 rank_ == c_.root ? reduced_value(c_, n_, i) : input_value(c_, rank_, i));
        }
        break;
      case BenchOp::kBroadcast:
        for (int64_t i = 0; i < per_rank; ++i) expect(result, i, input_value(c_, c_.root, i));
        break;
      case BenchOp::kAllgather:
        for (int r = 0; r < n_; ++r) {
          for (int64_t i = 0; i < per_rank; ++i)
            expect(result, r * per_rank + i, input_value(c_, r, i));
        }
        break;
      case BenchOp::kReduceScatter: {
        const int64_t base = in_place ? per_rank * rank_ : 0;
        for (int64_t i = 0; i < per_rank; ++i) {
          expect(result, base + i, reduced_value(c_, n_, per_rank * rank_ + i));
        }
        break;
      }
      case BenchOp::kSendRecv:
        if (rank_ <= 1 && n_ > 1) {
          for (int64_t i = 0; i < per_rank; ++i) expect(result, i, input_value(c_, 1 - rank_, i));
        }
        break;
      case BenchOp::kBarrier: break;
      case BenchOp::kAlltoall:
        // Block r here is rank r's block for this rank.
        for (int r = 0; r < n_; ++r) {
          for (int64_t i = 0; i < per_rank; ++i) {
            expect(result, r * per_rank + i, input_value(c_, r, rank_ * per_rank + i));
          }
        }
        break;
      case BenchOp::kGather:
        if (rank_ == c_.root) {
          for (int r = 0; r < n_; ++r) {
            for (int64_t i = 0; i < per_rank; ++i)
              expect(result, r * per_rank + i, input_value(c_, r, i));
          }
        }
        break;
      case BenchOp::kScatter:
        for (int64_t i = 0; i < per_rank; ++i) {
          expect(result, i, input_value(c_, c_.root, rank_ * per_rank + i));
        }
        break;
    }
    std::vector<int64_t> total = {wrong};
    meta_->allreduce(TensorView(total));
    return total[0];
  }

  std::shared_ptr<CollectiveGroup> g_;
  std::shared_ptr<CollectiveGroup> meta_;
  Config c_;
  int n_;
  int rank_;
  std::unique_ptr<Baseline> raw_;
  bool like_for_like_ = true;
  std::vector<char> in_, out_, scratch_;
  std::shared_ptr<SymmetricMemory> sym_in_, sym_out_;  // --symmetric: twins the ops run on
  bool gpu_ = false;
  int device_ = 0;
#if TUTTI_BENCH_CUDA
  char* d_in_ = nullptr;
  char* d_out_ = nullptr;
  char* d_scratch_ = nullptr;
  size_t device_bytes_ = 0;
#endif
};

std::string host_list(CollectiveGroup& g) {
  char name[64] = {0};
  gethostname(name, sizeof(name) - 1);
  std::vector<char> mine(name, name + 64);
  std::vector<char> all(64 * static_cast<size_t>(g.world_size()));
  g.allgather(TensorView(reinterpret_cast<uint8_t*>(all.data()), all.size()),
              TensorView(reinterpret_cast<uint8_t*>(mine.data()), mine.size()));
  // "vm (2 ranks), other (2 ranks)", in rank order of first appearance.
  std::vector<std::pair<std::string, int>> hosts;
  for (int r = 0; r < g.world_size(); ++r) {
    const std::string h(all.data() + 64 * r, strnlen(all.data() + 64 * r, 64));
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& p) { return p.first == h; });
    if (it == hosts.end()) {
      hosts.push_back({h, 1});
    } else {
      ++it->second;
    }
  }
  std::string out;
  for (const auto& [h, k] : hosts) {
    out +=
        (out.empty() ? "" : ", ") + h + " (" + std::to_string(k) + (k == 1 ? " rank)" : " ranks)");
  }
  return out;
}

std::string fmt_num(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

void write_json(const std::string& path, const Config& c, const std::string& backend,
                const std::string& baseline, int world, const std::string& hosts,
                const std::vector<Row>& rows) {
  std::ofstream out(path);
  out.precision(10);
  out << "{\n  \"config\": {\"tool\": \"tutti-bench\", \"version\": \"" << tutti::version()
      << "\", \"op\": \"" << to_string(c.op) << "\", \"backend\": \"" << backend
      << "\", \"world_size\": " << world << ", \"hosts\": \"" << hosts << "\", \"dtype\": \""
      << tutti::to_string(c.dtype) << "\", \"redop\": \"" << tutti::to_string(c.redop)
      << "\", \"root\": " << c.root << ", \"warmup\": " << c.warmup << ", \"iters\": " << c.iters
      << ", \"time_budget_ms\": " << c.time_budget_ms
      << ", \"check\": " << (c.check ? "true" : "false")
      << ", \"baseline\": " << (c.baseline ? "\"" + baseline + "\"" : "null")
      << ", \"bus_factor\": " << bus_factor(c.op, world)
      << ", \"async\": " << (c.async ? "true" : "false")
      << ", \"symmetric\": " << (c.symmetric ? "true" : "false") << "},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "    {\"op\": \"" << to_string(c.op) << "\", \"size_bytes\": " << r.bytes
        << ", \"count\": " << r.count << ", \"dtype\": \"" << tutti::to_string(c.dtype)
        << "\", \"redop\": \"" << tutti::to_string(c.redop) << "\", \"root\": " << c.root
        << ", \"in_place\": " << (r.in_place ? "true" : "false") << ", \"time_us\": " << r.time_us
        << ", \"p99_us\": " << r.p99_us << ", \"mean_us\": " << r.mean_us
        << ", \"algbw_gbps\": " << r.algbw << ", \"busbw_gbps\": " << r.busbw
        << ", \"wrong\": " << (c.check ? std::to_string(r.wrong) : "null");
    if (r.baseline_us >= 0) {
      out << ", \"baseline_time_us\": " << r.baseline_us
          << ", \"ratio\": " << (r.baseline_us > 0 ? r.time_us / r.baseline_us : 0);
    }
    if (r.hidden >= 0) {
      out << ", \"compute_us\": " << r.compute_us << ", \"overlapped_us\": " << r.overlapped_us
          << ", \"hidden\": " << r.hidden;
    }
    out << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
}

void write_csv(const std::string& path, const Config& c, const std::vector<Row>& rows) {
  std::ofstream out(path);
  out.precision(10);
  out << "op,size_bytes,count,dtype,redop,root,in_place,time_us,p99_us,mean_us,algbw_gbps,"
         "busbw_gbps,wrong";
  if (c.baseline) out << ",baseline_time_us,ratio";
  out << "\n";
  for (const Row& r : rows) {
    out << to_string(c.op) << "," << r.bytes << "," << r.count << "," << tutti::to_string(c.dtype)
        << "," << tutti::to_string(c.redop) << "," << c.root << "," << (r.in_place ? 1 : 0) << ","
        << r.time_us << "," << r.p99_us << "," << r.mean_us << "," << r.algbw << "," << r.busbw
        << "," << (c.check ? std::to_string(r.wrong) : "");
    if (c.baseline) {
      out << "," << r.baseline_us << "," << (r.baseline_us > 0 ? r.time_us / r.baseline_us : 0);
    }
    out << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  bool help = false;
  if (auto error = parse_args(argc, argv, c, help)) {
    std::fprintf(stderr, "tutti-bench: %s\n(see tutti-bench --help)\n", error->c_str());
    return 2;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (c.ranks > 0 && !std::getenv("TUTTI_RANK")) return relaunch(argc, argv, c);

  try {
    std::string backend = c.backend;
    if (backend.empty())
      backend = std::getenv("TUTTI_BACKEND") ? std::getenv("TUTTI_BACKEND") : "auto";
    const std::string name = "tutti-bench";
    GroupOptions options;
    options.timeout = std::chrono::minutes(5);
    if (has_launch_env()) {
      init_collective_group_from_env(backend, name, options);
      init_collective_group_from_env("auto", name + "-meta", options);
    } else {
      init_collective_group(1, 0, backend, name, options);
      init_collective_group(1, 0, "auto", name + "-meta", options);
    }
    auto group = get_group(name);
    auto meta = get_group(name + "-meta");
    if (c.op == BenchOp::kTransfer) {
      const int rc = run_transfer_bench(c, *meta);
      destroy_collective_group(name);
      destroy_collective_group(name + "-meta");
      return rc;
    }
    const int world = group->world_size();
    const int rank = group->rank();
    const bool rooted = c.op == BenchOp::kBroadcast || c.op == BenchOp::kReduce ||
                        c.op == BenchOp::kGather || c.op == BenchOp::kScatter;
    if (rooted && c.root >= world) {
      if (rank == 0)
        std::fprintf(stderr, "tutti-bench: -r %d is not a rank of %d\n", c.root, world);
      return 2;
    }
    if (c.op == BenchOp::kSendRecv && world < 2) {
      if (rank == 0) std::fprintf(stderr, "tutti-bench: sendrecv needs at least 2 ranks\n");
      return 2;
    }
    Bench bench(group, meta, c);
    const bool gpu = group->backend_name() == "nccl";
    int device = 0;
    if (gpu) {
#if TUTTI_BENCH_CUDA
      device = local_rank() >= 0 ? local_rank() : 0;
      cudaSetDevice(device);
      bench.use_gpu(device);
#else
      if (rank == 0) std::fprintf(stderr, "tutti-bench: built without CUDA: no GPU buffers\n");
      return 2;
#endif
    }
    std::string baseline_name;
    if (c.baseline) {
      auto store = world > 1 ? open_store(read_launch_env().store_url, std::chrono::minutes(2))
                             : std::shared_ptr<Store>(new HashStore());
      const std::string job = std::getenv("TUTTI_JOB_ID") ? std::getenv("TUTTI_JOB_ID") : "";
      std::unique_ptr<Baseline> raw;
      if (gpu) {
#if TUTTI_BENCH_CUDA
        raw = std::make_unique<RawNccl>(
            std::make_shared<PrefixStore>("tutti-bench/raw-nccl/" + job, store), rank, world, c,
            device);
#endif
      } else if (group->backend_name() == "gloo" || group->backend_name() == "shm") {
        // CPU backends are compared with raw Gloo, the library CPU users would call instead.
        const std::string why = RawGloo::unsupported_reason(c);
        if (!why.empty()) {
          if (rank == 0) std::fprintf(stderr, "tutti-bench: --baseline: %s\n", why.c_str());
          return 2;
        }
        raw = std::make_unique<RawGloo>(
            std::make_shared<PrefixStore>("tutti-bench/raw-gloo/" + job, store), rank, world, c);
      } else {
        if (rank == 0) {
          std::fprintf(stderr, "tutti-bench: backend '%s' has no --baseline\n",
                       group->backend_name().c_str());
        }
        return 2;
      }
      baseline_name = raw->name();
      bench.set_baseline(std::move(raw), group->backend_name() != "shm");
    }
    const std::string hosts = host_list(*meta);
    const bool reducing =
        c.op == BenchOp::kAllreduce || c.op == BenchOp::kReduce || c.op == BenchOp::kReduceScatter;
    if (rank == 0) {
      std::printf("# tutti-bench %s: %s\n", tutti::version(), to_string(c.op));
      std::printf("# backend %s, world size %d, hosts: %s\n", group->backend_name().c_str(), world,
                  hosts.c_str());
      if (c.symmetric) {
        std::printf("# buffers: in the group's symmetric memory (--symmetric)\n");
      }
      std::printf(
          "# dtype %s, redop %s, root %d, warmup %d, %s, check %d%s\n", tutti::to_string(c.dtype),
          reducing ? tutti::to_string(c.redop) : "none", c.root, c.warmup,
          c.time_budget_ms > 0
              ? ("time budget " + fmt_num(c.time_budget_ms, "%g") + " ms/size").c_str()
              : ("iters " + std::to_string(c.iters)).c_str(),
          c.check ? 1 : 0,
          c.baseline
              ? (", baseline " + baseline_name +
                 (group->backend_name() == "shm" ? " (after tutti, per size)" : " (interleaved)"))
                    .c_str()
              : "");
      std::printf(
          "# time: median (p99) over iterations of the slowest rank; busbw = algbw x %.4g\n",
          bus_factor(c.op, world));
      std::printf("#\n");
      std::printf("# %10s %12s %8s %6s %4s  %s%s\n", "", "", "", "", "",
                  "---------------- out-of-place ----------------   ",
                  "----------------- in-place -----------------");
      std::printf("# %10s %12s %8s %6s %4s  %9s %9s %7s %7s %6s   %9s %9s %7s %7s %6s%s\n", "size",
                  "count", "type", "redop", "root", "time", "p99", "algbw", "busbw", "#wrong",
                  "time", "p99", "algbw", "busbw", "#wrong",
                  c.baseline ? "   raw-time  ratio"
                  : c.async  ? "     t_comp    t_both hidden"
                             : "");
      std::printf("# %10s %12s %8s %6s %4s  %9s %9s %7s %7s %6s   %9s %9s %7s %7s %6s%s\n", "(B)",
                  "(elements)", "", "", "", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)",
                  "(GB/s)", "(GB/s)", "",
                  c.baseline ? "       (us)  t/raw"
                  : c.async  ? "       (us)      (us)    (%)"
                             : "");
    }
    std::vector<Row> rows;
    auto cells = [&](const Row* r) {
      if (r == nullptr) return std::string("      N/A       N/A     N/A     N/A    N/A");
      return fmt_num(r->time_us, "%9.1f") + " " + fmt_num(r->p99_us, "%9.1f") + " " +
             fmt_num(r->algbw, "%7.3f") + " " + fmt_num(r->busbw, "%7.3f") + " " +
             (c.check ? fmt_num(static_cast<double>(r->wrong), "%6.0f") : std::string("   N/A"));
    };
    for (uint64_t bytes : sweep(c.min_bytes, c.max_bytes, c.factor)) {
      std::optional<Row> oop, ip;
      if (bench.has_out_of_place()) oop = bench.measure(bytes, false);
      if (bench.has_in_place()) ip = bench.measure(bytes, true);
      if (oop) rows.push_back(*oop);
      if (ip) rows.push_back(*ip);
      if (rank != 0) continue;
      // The size and the baseline ratio come from the first placement measured.
      const Row& first = oop ? *oop : *ip;
      std::string ratio;
      if (first.baseline_us >= 0) {
        ratio = "  " + fmt_num(first.baseline_us, "%9.1f") + " " +
                fmt_num(first.baseline_us > 0 ? first.time_us / first.baseline_us : 0, "%6.2f");
      }
      if (first.hidden >= 0) {
        ratio = "  " + fmt_num(first.compute_us, "%9.1f") + " " +
                fmt_num(first.overlapped_us, "%9.1f") + " " + fmt_num(100 * first.hidden, "%6.1f");
      }
      std::printf("  %10llu %12lld %8s %6s %4d  %s   %s%s\n",
                  static_cast<unsigned long long>(first.bytes), static_cast<long long>(first.count),
                  tutti::to_string(c.dtype), reducing ? tutti::to_string(c.redop) : "none",
                  rooted ? c.root : -1, cells(oop ? &*oop : nullptr).c_str(),
                  cells(ip ? &*ip : nullptr).c_str(), ratio.c_str());
      std::fflush(stdout);
    }
    double sum_busbw = 0;
    int64_t total_wrong = 0;
    for (const Row& r : rows) {
      sum_busbw += r.busbw;
      total_wrong += r.wrong;
    }
    const size_t n_busbw = rows.size();
    if (rank == 0) {
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                  total_wrong == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %.4g GB/s\n", n_busbw ? sum_busbw / n_busbw : 0.0);
      if (c.async) {
        std::vector<double> hidden;
        for (const Row& r : rows) hidden.push_back(r.hidden);
        std::printf("# Allreduce hidden behind compute: median %.1f%% over sizes\n",
                    100 * quantile(hidden, 0.5));
      }
      if (!c.json.empty()) {
        write_json(c.json, c, group->backend_name(), baseline_name, world, hosts, rows);
      }
      if (!c.csv.empty()) write_csv(c.csv, c, rows);
      std::fflush(stdout);
    }
    // Nobody exits (a failing exit status ends the job under tutti-run) before rank 0 has
    // printed the summary.
    meta->barrier();
    destroy_collective_group(name);
    destroy_collective_group(name + "-meta");
    return total_wrong == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "tutti-bench: %s\n", e.what());
    return 1;
  }
}
