// The --baseline: the same ops straight on Gloo's function API, on a Gloo context of its own
// (created through the job's store), so tutti's overhead is measured side by side.
#pragma once

#include <memory>
#include <string>

#include "baseline.h"
#include "bench_math.h"
#include "tutti/store.h"

namespace tutti::bench {

class RawGloo : public Baseline {
 public:
  // Throws tutti::Error(kUnavailable) naming what raw Gloo cannot run (an op Gloo lacks, a dtype
  // it has no reduction for).
  RawGloo(std::shared_ptr<Store> store, int rank, int world_size, const Config& config);
  ~RawGloo() override;
  const char* name() const override { return "raw gloo"; }

  static std::string unsupported_reason(const Config& config);

  // One op on raw Gloo with the same buffers tutti got; returns nothing, throws on failure.
  void run(void* in, void* out, void* scratch, int64_t per_rank, bool in_place) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::bench
