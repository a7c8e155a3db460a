// What --baseline runs beside tutti: the same op straight on the library underneath.
#pragma once

#include <cstdint>

namespace tutti::bench {

class Baseline {
 public:
  virtual ~Baseline() = default;
  virtual const char* name() const = 0;  // "raw gloo", "raw nccl"
  // One op on the same buffers tutti got (device pointers for GPU baselines); returns when the
  // op has finished.
  virtual void run(void* in, void* out, void* scratch, int64_t per_rank, bool in_place) = 0;
};

}  // namespace tutti::bench
