// Registers "gloo" (and "hier", built on it) when libtutti_gloo is loaded. The library is linked
// with --no-as-needed (see backends/gloo/CMakeLists.txt), so linking tutti::gloo is enough even in
// a program that names none of its symbols.
#include "gloo_backend.h"
#include "hier/hier_backend.h"
#include "transfer/group_transport.h"
#include "tutti/backend.h"
#include "tutti/tensor_transport.h"

namespace {

struct RegisterGloo {
  RegisterGloo() {
    tutti::BackendInfo info;
    info.name = "gloo";
    info.factory = [](const tutti::BackendContext& ctx) {
      return std::make_unique<tutti::gloo_backend::GlooBackend>(ctx);
    };
    info.scope = tutti::BackendInfo::Scope::kAnyHost;  // TCP: "auto" across hosts
    info.priority = 10;
    tutti::register_collective_backend(std::move(info));

    // Two levels (shm on each host, Gloo between hosts): "auto" takes it for ranks on several
    // hosts with several on one.
    tutti::BackendInfo hier;
    hier.name = "hier";
    hier.factory = [](const tutti::BackendContext& ctx) {
      return std::make_unique<tutti::gloo_backend::HierBackend>(ctx);
    };
    hier.scope = tutti::BackendInfo::Scope::kAnyHost;
    hier.priority = 15;
    hier.suits = &tutti::gloo_backend::HierBackend::suits;
    tutti::register_collective_backend(std::move(hier));

    // The direct transport's two-sided "gloo": the owner sends, the consumer receives, over a
    // group of this backend (TransferAgent::join_group); never "auto" (it needs that group).
    tutti::TransportInfo transport;
    transport.name = "gloo";
    transport.factory = [](const tutti::TransportContext& ctx) {
      return tutti::detail::make_group_transport("gloo", /*cuda=*/false, ctx);
    };
    transport.priority = -1;
    tutti::register_tensor_transport(std::move(transport));
  }
};

const RegisterGloo kRegisterGloo;

}  // namespace
