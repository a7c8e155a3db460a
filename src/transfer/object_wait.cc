// The owner waiting for its tensors to be free again: wait_tensor_freed, what holds an object,
// and the write checks (PutOptions::check_writes) (agent_core.h).
#include "transfer/agent_core.h"
#include "transfer/wire.h"
#include "util/logging.h"

namespace tutti::detail {

// PutOptions::check_writes: a CRC32C per CPU tensor.
std::vector<uint32_t> checksums(const std::vector<TensorView>& tensors) {
  std::vector<uint32_t> out;
  for (const TensorView& t : tensors) {
    out.push_back(t.device().type == DeviceType::kCPU && t.nbytes() > 0
                      ? crc32c(std::string_view(static_cast<const char*>(t.data()), t.nbytes()))
                      : 0);
  }
  return out;
}

void AgentCore::check_writes_locked(const Object& o) {
  if (!o.check_writes || o.crcs.empty()) return;
  const std::vector<uint32_t> now = checksums(o.tensors);
  if (now == o.crcs) return;
  std::string which;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] != o.crcs[i]) which += (which.empty() ? "" : ", ") + std::to_string(i);
  }
  WriteViolation v;
  v.tensors = o.tensors;
  v.text = "object " + std::to_string(o.id) + " (" + o.transport +
           ") changed after put: tensor(s) " + which +
           " were written while published; call wait_tensor_freed before writing";
  TUTTI_LOG_ERROR("direct transport: {}: {}", who(), v.text);
  violations.push_back(std::move(v));
  if (violations.size() > 1024) violations.pop_front();
}

std::string AgentCore::blockers_locked(const Object& o) const {
  std::vector<std::string> why;
  if (o.handles > 0) why.push_back(std::to_string(o.handles) + " owner handle(s) alive");
  if (o.expected_gets > 0) why.push_back(std::to_string(o.expected_gets) + " expected get(s) left");
  const auto now = Clock::now();
  if (o.handles == 0 && now < o.keep_until) {
    why.push_back(
        "kept for " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(o.keep_until - now).count()) +
        " ms more");
  }
  if (o.local_leases > 0)
    why.push_back(std::to_string(o.local_leases) +
                  " transfer(s) or borrow(s) by the owner or a remote consumer");
  for (const auto& [uuid, c] : consumers) {
    if (c->lane && c->lane->holds(o.slot, o.generation)) {
      why.push_back("leased by agent '" + c->identity.name + "' (pid " +
                    std::to_string(c->identity.pid) + ")");
    }
  }
  std::string out = "object " + std::to_string(o.id) + " (";
  for (size_t i = 0; i < why.size(); ++i) out += (i ? "; " : "") + why[i];
  return out + ")";
}

void AgentCore::wait_tensor_freed(const TensorView& tensor, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const char* lo = static_cast<const char*>(tensor.data());
  const char* hi = lo + tensor.nbytes();
  std::unique_lock<std::mutex> lock(mutex);
  auto holders = [&] {
    std::vector<const Object*> out;
    for (const auto& [id, o] : objects) {
      for (const TensorView& t : o.tensors) {
        const char* a = static_cast<const char*>(t.data());
        if (t.device() == tensor.device() && t.nbytes() > 0 && a < hi && lo < a + t.nbytes()) {
          out.push_back(&o);
          break;
        }
      }
    }
    return out;
  };
  while (true) {
    const auto held = holders();
    if (held.empty()) {
      // Objects over these bytes that the owner wrote while published (check_writes).
      for (auto v = violations.begin(); v != violations.end(); ++v) {
        for (const TensorView& t : v->tensors) {
          const char* a = static_cast<const char*>(t.data());
          if (t.device() == tensor.device() && t.nbytes() > 0 && a < hi && lo < a + t.nbytes()) {
            const std::string text = v->text;
            violations.erase(v);
            throw Error(ErrorCode::kRemoteError, "wait_tensor_freed on " + who() + ": " + text);
          }
        }
      }
      return;
    }
    if (Clock::now() >= deadline) {
      std::string list;
      for (const Object* o : held) list += (list.empty() ? "" : ", ") + blockers_locked(*o);
      throw Error(ErrorCode::kTimeout, "wait_tensor_freed on " + who() + ": " + tensor.str() +
                                           " still published after " +
                                           std::to_string(timeout.count()) + " ms: " + list);
    }
    changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    reap_consumers_locked();  // a consumer that exited after its connections closed
    settle_all_locked();      // a lane may have let go without telling (a consumer thread's exit)
  }
}

}  // namespace tutti::detail
