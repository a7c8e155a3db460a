// Element-wise reduction kernels for every dtype and reduce op (internal, shared by the CPU
// backends; each library links its own copy, from tutti_util). float16 and bfloat16 reduce through
// float32 and round once per step. Kernels are vectorised, with AVX2/F16C versions chosen at load
// time where the CPU has them.
#pragma once

#include <cstddef>

#include "tutti/types.h"

namespace tutti::detail {

// out[i] = a[i] (op) b[i] for i < n. out may alias a or b. For kAvg this is the sum: divide
// afterwards with scale_average.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Never null for a valid (dtype, op) pair; kAvg on a non-floating dtype returns null.
ReduceFn reduce_function(DType dtype, ReduceOp op) noexcept;

// The bytes of one reduce_many block: small enough to stay in L1 while every input is folded in.
constexpr size_t kReduceBlockBytes = 16384;

// out = inputs[0] (op) inputs[1] (op) ... (op) inputs[count-1], element-wise, in blocks of
// kReduceBlockBytes.
// out may be one of the inputs only if it is inputs[0] or inputs[1] (the first step reads both
// before it writes; later steps read only inputs[2...]).
void reduce_many(ReduceFn fn, void* out, const void* const* inputs, int count, size_t n,
                 size_t element_size) noexcept;

// data[i] /= divisor, for floating dtypes.
void scale_average(void* data, DType dtype, size_t n, int divisor) noexcept;

}  // namespace tutti::detail
