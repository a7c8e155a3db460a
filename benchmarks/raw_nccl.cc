#include "raw_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "nccl_types.h"
#include "tutti/error.h"

namespace tutti::bench {
namespace {
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw Error(ErrorCode::kInternal, std::string("raw nccl: ") + what + ": " + ncclGetErrorString(r));
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
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set("id", std::string(id.internal, sizeof(id.internal)));
  } else {
    const std::string bytes = store->get("id");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  check(ncclCommInitRank(&impl_->comm, world_size, id, rank), "ncclCommInitRank");
  cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking);
}

RawNccl::~RawNccl() {
  if (impl_->comm) ncclCommDestroy(impl_->comm);
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
    case BenchOp::kAllreduce: check(ncclAllReduce(o, o, n, dt, op, m.comm, m.stream), "allreduce"); break;
    case BenchOp::kBroadcast:
      check(ncclBroadcast(o, o, n, dt, m.config.root, m.comm, m.stream), "broadcast");
      break;
    case BenchOp::kReduce:
      check(ncclReduce(o, o, n, dt, op, m.config.root, m.comm, m.stream), "reduce");
      break;
    case BenchOp::kAllgather:
      check(ncclAllGather(in_place ? o + m.rank * bytes : in, o, n, dt, m.comm, m.stream),
            "allgather");
      break;
    case BenchOp::kReduceScatter:
      check(ncclReduceScatter(in_place ? o : in, in_place ? o + m.rank * bytes : o, n, dt, op,
                              m.comm, m.stream),
            "reduce_scatter");
      break;
    case BenchOp::kSendRecv:
      if (m.rank <= 1) {
        const int peer = 1 - m.rank;
        if (m.rank == 0) {
          check(ncclSend(in, n, dt, peer, m.comm, m.stream), "send");
          cudaStreamSynchronize(m.stream);
          check(ncclRecv(o, n, dt, peer, m.comm, m.stream), "recv");
        } else {
          check(ncclRecv(o, n, dt, peer, m.comm, m.stream), "recv");
          cudaStreamSynchronize(m.stream);
          check(ncclSend(in, n, dt, peer, m.comm, m.stream), "send");
        }
      }
      break;
    case BenchOp::kBarrier:
      check(ncclAllReduce(o, o, 1, ncclUint8, ncclMax, m.comm, m.stream), "barrier");
      break;
  }
  cudaStreamSynchronize(m.stream);
}

}  // namespace tutti::bench
