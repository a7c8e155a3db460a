// Element-wise reduction kernels for every dtype and reduce op (internal, shared by the CPU
// backends). float16 and bfloat16 reduce through float32 and round once per step.
#pragma once

#include <cstddef>

#include "tutti/export.h"
#include "tutti/types.h"

namespace tutti::detail {

// out[i] = a[i] (op) b[i] for i < n. out may alias a or b. For kAvg this is the sum: divide
// afterwards with scale_average.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Never null for a valid (dtype, op) pair; kAvg on a non-floating dtype returns null.
TUTTI_API ReduceFn reduce_function(DType dtype, ReduceOp op) noexcept;

// data[i] /= divisor, for floating dtypes.
TUTTI_API void scale_average(void* data, DType dtype, size_t n, int divisor) noexcept;

}  // namespace tutti::detail
