// Registers "gloo" when libtutti_gloo is loaded. The library is linked with --no-as-needed
// (see backends/gloo/CMakeLists.txt), so linking tutti::gloo is enough even in a program that
// names none of its symbols.
#include "gloo_backend.h"
#include "tutti/backend.h"

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
  }
};

const RegisterGloo kRegisterGloo;

}  // namespace
