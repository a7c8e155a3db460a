// Registers "nccl" when libtutti_nccl is loaded (linked with --no-as-needed, like tutti::gloo).
// is_backend_available("nccl") says whether NCCL loads and a CUDA device is visible.
#include "nccl_api.h"
#include "nccl_backend.h"
#include "tutti/backend.h"

namespace {

struct RegisterNccl {
  RegisterNccl() {
    tutti::register_collective_backend(
        "nccl",
        [](const tutti::BackendContext& ctx) {
          return std::make_unique<tutti::nccl_backend::NcclBackend>(ctx);
        },
        [] { return tutti::nccl_backend::nccl_available(); });
  }
};

const RegisterNccl kRegisterNccl;

}  // namespace
