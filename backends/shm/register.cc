// Registers "shm" when libtutti_shm is loaded (linked with --no-as-needed, like tutti::gloo).
#include "shm_backend.h"
#include "tutti/backend.h"

namespace {

struct RegisterShm {
  RegisterShm() {
    tutti::register_collective_backend("shm", [](const tutti::BackendContext& ctx) {
      return std::make_unique<tutti::shm_backend::ShmBackend>(ctx);
    });
  }
};

const RegisterShm kRegisterShm;

}  // namespace
