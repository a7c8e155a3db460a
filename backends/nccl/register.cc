// Registers "nccl" when libtutti_nccl is loaded (linked with --no-as-needed, like tutti::gloo).
// is_backend_available("nccl") says whether NCCL loads and a CUDA device is visible.
#include "nccl_api.h"
#include "nccl_backend.h"
#include "tutti/backend.h"

namespace {

struct RegisterNccl {
  RegisterNccl() {
    tutti::BackendInfo info;
    info.name = "nccl";
    info.factory = [](const tutti::BackendContext& ctx) {
      return std::make_unique<tutti::nccl_backend::NcclBackend>(ctx);
    };
    info.available = [] { return tutti::nccl_backend::nccl_available(); };
    info.devices = {tutti::DeviceType::kCUDA};
    info.scope = tutti::BackendInfo::Scope::kAnyHost;
    tutti::register_collective_backend(std::move(info));
  }
};

const RegisterNccl kRegisterNccl;

}  // namespace
