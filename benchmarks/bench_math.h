// tutti-bench's arithmetic and option parsing, separate from I/O so that tests can check them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stats.h"  // quantile, mean
#include "tutti/types.h"

namespace tutti::bench {

enum class BenchOp {
  kAllreduce,
  kAllgather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kSendRecv,
  kBarrier,
  kAlltoall,
  kGather,
  kScatter,
  kTransfer,  // the direct transport: rank 0 publishes, rank 1 gets (transfer_bench.cc)
};

// The ops whose nccl-tests size is the whole buffer of world_size blocks.
bool is_blocked(BenchOp op);

const char* to_string(BenchOp op);

// nccl-tests' bus-bandwidth factor: busbw = algbw x factor, so that busbw is comparable to the
// hardware's link bandwidth whatever the world size:
//   allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall, gather, scatter (n-1)/n;
//   broadcast, reduce, sendrecv 1; barrier 0 (it moves no data).
double bus_factor(BenchOp op, int world_size);

// The per-rank element count for a message of `bytes` (nccl-tests' "size": the whole buffer of
// world_size blocks for allgather, reduce_scatter, alltoall, gather and scatter, the one buffer
// otherwise), rounded down, at least 1.
int64_t elements_per_rank(BenchOp op, uint64_t bytes, size_t element_size, int world_size);
// The size that count actually moves, in bytes, and the element count printed in the table.
uint64_t message_bytes(BenchOp op, int64_t per_rank, size_t element_size, int world_size);

// Sizes from min to max multiplied by factor each step (max always included).
std::vector<uint64_t> sweep(uint64_t min_bytes, uint64_t max_bytes, double factor);

// "8", "64K", "1M", "2G" (powers of 1024); nullopt when malformed.
std::optional<uint64_t> parse_size(const std::string& text);

struct Config {
  BenchOp op = BenchOp::kAllreduce;
  std::string backend;  // empty: TUTTI_BACKEND, else gloo
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64ull << 20;
  double factor = 2.0;
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  int warmup = 5;
  int iters = 20;
  double time_budget_ms = 0;  // >0: iterations per size from this budget instead of iters
  bool check = true;
  bool baseline = false;
  std::string json;
  std::string csv;
  int ranks = 0;                  // >0: start this many local ranks through tutti-run
  int corrupt_rank = -1;          // testing -c: this rank corrupts one element of its result
  bool async = false;             // --async: measure how much of an allreduce hides behind compute
  bool symmetric = false;         // --symmetric: the op's buffers in the group's symmetric memory
  std::string transport = "shm";  // --op transfer: the tensor transport
  bool borrow = false;            // --op transfer --mode borrow (else copy)
  bool heap_source = false;       // --op transfer --source heap (else shareable, for shm)
};

// Parses tutti-bench's arguments; on a bad value returns the message to print (exit code 2);
// `help` is set for -h/--help.
std::optional<std::string> parse_args(int argc, char** argv, Config& config, bool& help);

}  // namespace tutti::bench
