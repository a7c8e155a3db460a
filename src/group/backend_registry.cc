#include "group/backend_registry.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>

#include "tutti/error.h"
#include "tutti/plugin_loader.h"

namespace tutti {
namespace detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendInfo> entries;
};

Registry& registry() {
  // Leaked: backends register from static initialisers of other libraries, and groups torn
  // down at exit may still look backends up.
  static auto* instance = new Registry();
  return *instance;
}

std::vector<BackendInfo> snapshot() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<BackendInfo> out;
  for (const auto& [key, info] : reg.entries) out.push_back(info);
  return out;
}

bool usable(const BackendInfo& info) {
  return !info.available || info.available();
}

bool on_cpu(const BackendInfo& info) {
  return std::find(info.devices.begin(), info.devices.end(), DeviceType::kCPU) !=
         info.devices.end();
}

std::string names(const std::vector<BackendInfo>& infos) {
  std::string out;
  for (const auto& info : infos) out += (out.empty() ? "" : ", ") + info.name;
  return out.empty() ? std::string("none") : out;
}

}  // namespace

std::string backend_key(std::string_view name) {
  std::string key(name);
  std::transform(key.begin(), key.end(), key.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return key;
}

BackendInfo find_backend(std::string_view name) {
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.entries.find(backend_key(name));
    if (it != reg.entries.end()) return it->second;
  }
  throw Error(ErrorCode::kUnavailable, "backend '" + std::string(name) +
                                           "' is not registered (registered: " + names(snapshot()) +
                                           "; link its target, e.g. tutti::shm)");
}

BackendInfo choose_auto_backend(const std::vector<std::string>& hosts) {
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts.front(); });
  const BackendInfo* best = nullptr;
  const auto all = snapshot();
  for (const auto& info : all) {
    if (!on_cpu(info) || !usable(info)) continue;
    if (info.scope == BackendInfo::Scope::kOneHost && !one_host) continue;
    if (info.suits && !info.suits(hosts)) continue;
    if (best == nullptr || info.priority > best->priority) best = &info;
  }
  if (best == nullptr) {
    throw Error(ErrorCode::kUnavailable,
                std::string("backend 'auto' found no available CPU backend for ranks on ") +
                    (one_host ? "one host" : "several hosts") + " (registered: " + names(all) +
                    ")");
  }
  return *best;
}

}  // namespace detail

void register_collective_backend(BackendInfo info) {
  const std::string key = detail::backend_key(info.name);
  if (key.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "register_collective_backend: empty backend name");
  }
  if (key == "auto") {
    throw Error(ErrorCode::kInvalidUsage,
                "register_collective_backend: 'auto' is reserved (it picks a registered backend)");
  }
  if (!info.factory) {
    throw Error(ErrorCode::kInvalidArgument,
                "register_collective_backend('" + info.name + "'): null factory");
  }
  info.name = key;
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (reg.entries.count(key) != 0) {
    throw Error(ErrorCode::kInvalidUsage,
                "register_collective_backend: backend '" + key + "' is already registered");
  }
  reg.entries.emplace(key, std::move(info));
}

void register_collective_backend(std::string_view name, BackendFactory factory,
                                 std::function<bool()> available) {
  BackendInfo info;
  info.name = std::string(name);
  info.factory = std::move(factory);
  info.available = std::move(available);
  register_collective_backend(std::move(info));
}

bool is_registered_collective_backend(std::string_view name) {
  load_plugins_from_env();                               // TUTTI_PLUGINS, at the first lookup
  if (detail::backend_key(name) == "auto") return true;  // resolved by each group
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.entries.count(detail::backend_key(name)) != 0;
}

bool is_backend_available(std::string_view name) {
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  if (detail::backend_key(name) == "auto") {
    for (const auto& info : detail::snapshot()) {
      if (detail::on_cpu(info) && detail::usable(info)) return true;
    }
    return false;
  }
  BackendInfo info;
  {
    auto& reg = detail::registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.entries.find(detail::backend_key(name));
    if (it == reg.entries.end()) return false;
    info = it->second;
  }
  return detail::usable(info);
}

std::unique_ptr<Backend> create_collective_backend(std::string_view name,
                                                   const BackendContext& ctx) {
  const BackendInfo info = detail::find_backend(name);
  if (!detail::usable(info)) {
    throw Error(ErrorCode::kUnavailable,
                "backend '" + info.name + "' is registered but not available here");
  }
  auto backend = info.factory(ctx);
  if (!backend)
    throw Error(ErrorCode::kInternal, "backend '" + info.name + "': factory returned null");
  return backend;
}

std::vector<std::string> registered_collective_backends() {
  load_plugins_from_env();  // TUTTI_PLUGINS, at the first lookup
  std::vector<std::string> out;
  for (const auto& info : detail::snapshot()) out.push_back(info.name);
  return out;
}

}  // namespace tutti
