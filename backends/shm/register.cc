// Registers the "shm" collective backend and tensor transport when libtutti_shm is loaded (linked
// with --no-as-needed, like tutti::gloo).
#include "shm_backend.h"
#include "tutti/backend.h"

namespace tutti::shm_backend {
void register_shm_transport();  // shm_transport.cc: the direct transport's "shm"
}  // namespace tutti::shm_backend

namespace {

struct RegisterShm {
  RegisterShm() {
    tutti::BackendInfo info;
    info.name = "shm";
    info.factory = [](const tutti::BackendContext& ctx) {
      return std::make_unique<tutti::shm_backend::ShmBackend>(ctx);
    };
    info.scope = tutti::BackendInfo::Scope::kOneHost;  // "auto" prefers it on one host
    info.priority = 20;
    tutti::register_collective_backend(std::move(info));
    tutti::shm_backend::register_shm_transport();
  }
};

const RegisterShm kRegisterShm;

}  // namespace
