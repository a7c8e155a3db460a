// --baseline for the nccl backend: the same ops straight on NCCL (a communicator of its own, made
// through the job's store), each waited for on the host as tutti-bench waits for tutti's.
#pragma once

#include <memory>

#include "baseline.h"
#include "bench_math.h"
#include "tutti/store.h"

namespace tutti::bench {

class RawNccl : public Baseline {
 public:
  RawNccl(std::shared_ptr<Store> store, int rank, int world_size, const Config& config, int device);
  ~RawNccl() override;
  const char* name() const override { return "raw nccl"; }
  void run(void* in, void* out, void* scratch, int64_t per_rank, bool in_place) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::bench
