// Registers "nccl" when libtutti_nccl is loaded (linked with --no-as-needed, like tutti::gloo).
// is_backend_available("nccl") says whether NCCL loads and a CUDA device is visible.
#include "nccl_api.h"
#include "nccl_backend.h"
#include "transfer/group_transport.h"
#include "tutti/backend.h"
#include "tutti/tensor_transport.h"

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

    // The direct transport's two-sided "nccl" for CUDA tensors, as gloo's for CPU ones.
    tutti::TransportInfo transport;
    transport.name = "nccl";
    transport.factory = [](const tutti::TransportContext& ctx) {
      return tutti::detail::make_group_transport("nccl", /*cuda=*/true, ctx);
    };
    transport.available = [] { return tutti::nccl_backend::nccl_available(); };
    transport.devices = {tutti::DeviceType::kCUDA};
    transport.priority = -1;
    tutti::register_tensor_transport(std::move(transport));
  }
};

const RegisterNccl kRegisterNccl;

}  // namespace
