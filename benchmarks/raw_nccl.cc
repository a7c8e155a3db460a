#include "raw_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "nccl_api.h"
#include "nccl_types.h"
#include "tutti/error.h"

namespace tutti::bench {
namespace {
// NCCL is loaded at run time, as the backend loads it (libnccl.so.2 or TUTTI_NCCL_LIBRARY), so
// tutti-bench starts without NCCL and builds where only NCCL's header is installed.
const nccl_backend::NcclApi& nccl() {
  return nccl_backend::nccl_api();
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw Error(ErrorCode::kInternal,
                std::string("raw nccl: ") + what + ": " + nccl().GetErrorString(r));
  }
}
}  // namespace

struct RawNccl::Impl {
  Config config;
  int rank = 0;
  int world = 1;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

RawNccl::RawNccl(std::shared_ptr<Store> store, int rank, int world_size, const Config& config,
                 int device)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  impl_->rank = rank;
  impl_->world = world_size;
  impl_->device = device;
  cudaSetDevice(device);
  ncclUniqueId id;
  if (rank == 0) {
    check(nccl().GetUniqueId(&id), "ncclGetUniqueId");
    store->set("id", std::string(id.internal, sizeof(id.internal)));
  } else {
    const std::string bytes = store->get("id");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;  // blocking, as ncclCommInitRank
  check(nccl().CommInitRankConfig(&impl_->comm, world_size, id, rank, &blocking),
        "ncclCommInitRankConfig");
  cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking);
}

RawNccl::~RawNccl() {
  if (impl_->comm) nccl().CommDestroy(impl_->comm);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void RawNccl::run(void* in, void* out, void*, int64_t per_rank, bool in_place) {
  Impl& m = *impl_;
  const size_t n = static_cast<size_t>(per_rank);
  const size_t bytes = n * dtype_size(m.config.dtype);
  const ncclDataType_t dt = nccl_backend::to_nccl(m.config.dtype);
  const ncclRedOp_t op = nccl_backend::to_nccl(m.config.redop, m.config.dtype);
  char* o = static_cast<char*>(out);
  switch (m.config.op) {
    case BenchOp::kAllreduce:
      check(nccl().AllReduce(o, o, n, dt, op, m.comm, m.stream), "allreduce");
      break;
    case BenchOp::kBroadcast:
      check(nccl().Broadcast(o, o, n, dt, m.config.root, m.comm, m.stream), "broadcast");
      break;
    case BenchOp::kReduce:
      check(nccl().Reduce(o, o, n, dt, op, m.config.root, m.comm, m.stream), "reduce");
      break;
    case BenchOp::kAllgather:
      check(nccl().AllGather(in_place ? o + m.rank * bytes : in, o, n, dt, m.comm, m.stream),
            "allgather");
      break;
    case BenchOp::kReduceScatter:
      check(nccl().ReduceScatter(in_place ? o : in, in_place ? o + m.rank * bytes : o, n, dt, op,
                                 m.comm, m.stream),
            "reduce_scatter");
      break;
    case BenchOp::kSendRecv:
      if (m.rank <= 1) {
        const int peer = 1 - m.rank;
        if (m.rank == 0) {
          check(nccl().Send(in, n, dt, peer, m.comm, m.stream), "send");
          cudaStreamSynchronize(m.stream);
          check(nccl().Recv(o, n, dt, peer, m.comm, m.stream), "recv");
        } else {
          check(nccl().Recv(o, n, dt, peer, m.comm, m.stream), "recv");
          cudaStreamSynchronize(m.stream);
          check(nccl().Send(in, n, dt, peer, m.comm, m.stream), "send");
        }
      }
      break;
    case BenchOp::kBarrier:
      check(nccl().AllReduce(o, o, 1, ncclUint8, ncclMax, m.comm, m.stream), "barrier");
      break;
    case BenchOp::kAlltoall:
    case BenchOp::kGather:
    case BenchOp::kScatter: {
      // NCCL has none of these: grouped sends and receives (a rank may send to itself).
      const BenchOp which = m.config.op;
      const int root = m.config.root;
      char* from = static_cast<char*>(in);
      check(nccl().GroupStart(), "group start");
      for (int r = 0; r < m.world; ++r) {
        if (which == BenchOp::kAlltoall) {
          check(nccl().Send(from + r * bytes, n, dt, r, m.comm, m.stream), "send");
          check(nccl().Recv(o + r * bytes, n, dt, r, m.comm, m.stream), "recv");
        } else if (which == BenchOp::kGather) {
          if (r == root) check(nccl().Send(from, n, dt, r, m.comm, m.stream), "send");
          if (m.rank == root) check(nccl().Recv(o + r * bytes, n, dt, r, m.comm, m.stream), "recv");
        } else {
          if (m.rank == root)
            check(nccl().Send(from + r * bytes, n, dt, r, m.comm, m.stream), "send");
          if (r == root) check(nccl().Recv(o, n, dt, r, m.comm, m.stream), "recv");
        }
      }
      check(nccl().GroupEnd(), "group end");
      break;
    }
  }
  cudaStreamSynchronize(m.stream);
}

}  // namespace tutti::bench
