// The layout list against tutti's declared headers (see cuda_layout.h).
#include "cuda_runtime_api.h"
#include "nccl.h"

#include <cstddef>

#include "cuda_layout.h"

TUTTI_DEFINE_CUDA_LAYOUT(cuda_layout_declared)
