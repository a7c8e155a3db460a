// DLPack interop: PyTorch, NumPy and CuPy tensors become TensorViews through DLPack.
//
// Only code that includes this header needs DLPack's header (Debian's libdlpack-dev, DLPack
// 0.6, which has no kDLBool: 8-bit kDLUInt with the bool flag is not distinguishable, so bool
// tensors arrive as uint8). Pure functions; thread-safe.
#pragma once

#include <dlpack/dlpack.h>

#include "tutti/export.h"
#include "tutti/tensor_view.h"

namespace tutti {

// A view of the DLPack tensor's data (data + byte_offset). Throws Error(kInvalidArgument) for a
// non-contiguous tensor (strides that are not row-major compact), a dtype tutti lacks, a device
// other than CPU, CUDA host-pinned or CUDA, or vector lanes.
TUTTI_API TensorView from_dlpack(const DLTensor& tensor);

// The DLPack dtype of a tutti dtype (kBool becomes 8-bit unsigned, see above).
TUTTI_API DLDataType to_dlpack_dtype(DType dtype);

}  // namespace tutti
