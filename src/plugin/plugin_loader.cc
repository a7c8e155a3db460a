// Loading plugins (tutti/plugin.h, tutti/plugin_loader.h): find the shared object, try its init
// in a child process, take the newest ABI version both sides know, check what it offers, then
// load it here and register its backends and transports.
#include "tutti/plugin_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "group/backend_registry.h"
#include "plugin/plugin_backend.h"
#include "tutti/backend.h"
#include "tutti/tensor_transport.h"
#include "util/logging.h"

namespace tutti::detail {
// transfer/transport_registry.cc (agent_core.h)
std::string transport_key(std::string_view name);
bool transport_name_taken(std::string_view name);
}  // namespace tutti::detail

namespace tutti {
namespace detail {
// Set while this thread loads plugins: a registry lookup made meanwhile (by a plugin's init, or
// by the checks below) must not start loading the environment's plugins again.
thread_local bool loading_plugins = false;
}  // namespace detail

namespace {

using detail::PluginLibrary;

// How long a plugin's init may take in the trial child (TUTTI_PLUGIN_INIT_TIMEOUT_MS).
constexpr auto kTrialTimeout = std::chrono::milliseconds(10000);

std::chrono::milliseconds trial_timeout() {
  if (const char* v = std::getenv("TUTTI_PLUGIN_INIT_TIMEOUT_MS")) {
    const long ms = std::strtol(v, nullptr, 10);
    if (ms > 0) return std::chrono::milliseconds(ms);
  }
  return kTrialTimeout;
}
// The highest version looked for, to tell a plugin too new from one with no symbol at all.
constexpr int kHighestVersionSeen = 64;

struct Loaded {
  LoadedPlugin info;
  std::shared_ptr<PluginLibrary> lib;
};

std::recursive_mutex& loads_mutex() {
  static auto* m = new std::recursive_mutex();
  return *m;
}

std::vector<Loaded>& loaded() {
  static auto* l = new std::vector<Loaded>();
  return *l;
}

std::string resolve(const std::string& path_or_name) {
  if (path_or_name.find('/') != std::string::npos) return path_or_name;
  const std::string file = "libtutti-plugin-" + path_or_name + ".so";
  if (const char* dirs = std::getenv("TUTTI_PLUGIN_PATH")) {
    std::string list = dirs;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(':', start), list.size());
      const std::string dir = list.substr(start, end - start);
      if (!dir.empty() && ::access((dir + "/" + file).c_str(), R_OK) == 0) return dir + "/" + file;
      start = end + 1;
    }
  }
  return file;  // the dynamic loader's own search
}

[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kUnavailable,
              "plugin " + what + (path != what ? " (" + path + ")" : "") + ": " + why);
}

// The version of tuttiPlugin_v<N> to take, or a reason why none.
int pick_version(void* handle, std::string& why) {
  for (int v = TUTTI_PLUGIN_ABI_VERSION; v >= TUTTI_PLUGIN_ABI_MIN_VERSION; --v) {
    if (::dlsym(handle, ("tuttiPlugin_v" + std::to_string(v)).c_str()) != nullptr) return v;
  }
  std::string has;
  for (int v = 0; v <= kHighestVersionSeen; ++v) {
    if (::dlsym(handle, ("tuttiPlugin_v" + std::to_string(v)).c_str()) != nullptr) {
      has += (has.empty() ? "" : ", ") + std::to_string(v);
    }
  }
  const std::string range = "this tutti takes ABI versions " +
                            std::to_string(TUTTI_PLUGIN_ABI_MIN_VERSION) + " to " +
                            std::to_string(TUTTI_PLUGIN_ABI_VERSION);
  if (has.empty()) {
    why = "exports no tuttiPlugin_v<N> (not a tutti plugin?); " + range;
  } else {
    why = "exports only ABI version(s) " + has + ", too " +
          (std::stoi(has) > TUTTI_PLUGIN_ABI_VERSION ? "new" : "old") + "; " + range;
  }
  return 0;
}

// What is wrong with a v1 plugin's tables, or empty.
std::string check_tables(const tuttiPlugin_v1_t& p) {
  if (p.name == nullptr || p.name[0] == '\0') return "tuttiPlugin_v1_t has no name";
  if (p.num_backends > 0 && p.backends == nullptr) return "num_backends without backends";
  if (p.num_transports > 0 && p.transports == nullptr) return "num_transports without transports";
  if (p.num_backends + p.num_transports == 0) return "offers no backend and no transport";
  for (size_t i = 0; i < p.num_backends; ++i) {
    const tuttiBackend_v1_t* b = p.backends[i];
    const std::string which = "backend " + std::to_string(i);
    if (b == nullptr || b->name == nullptr || b->name[0] == '\0') return which + " has no name";
    const std::string named = which + " ('" + b->name + "')";
    if (b->create == nullptr) return named + " has no create";
    if (b->destroy == nullptr) return named + " has no destroy";
    if (b->abort == nullptr) return named + " has no abort";
    if ((b->send == nullptr) != (b->recv == nullptr)) return named + " has send or recv alone";
  }
  for (size_t i = 0; i < p.num_transports; ++i) {
    const tuttiTransport_v1_t* t = p.transports[i];
    const std::string which = "transport " + std::to_string(i);
    if (t == nullptr || t->name == nullptr || t->name[0] == '\0') return which + " has no name";
    const std::string named = which + " ('" + t->name + "')";
    if (t->create == nullptr) return named + " has no create";
    if (t->destroy == nullptr) return named + " has no destroy";
    if (t->publish == nullptr) return named + " has no publish";
    if (t->fetch == nullptr) return named + " has no fetch";
    if (t->devices == 0) return named + " carries no device";
  }
  return "";
}

// Opens the shared object, picks its version and checks its tables; the plugin, or throws.
const tuttiPlugin_v1_t* open_plugin(const std::string& what, const std::string& path, void** handle,
                                    int* version) {
  *handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (*handle == nullptr) refuse(what, path, std::string("cannot be loaded: ") + ::dlerror());
  std::string why;
  *version = pick_version(*handle, why);
  if (*version == 0) refuse(what, path, why);
  const auto* p = static_cast<const tuttiPlugin_v1_t*>(
      ::dlsym(*handle, ("tuttiPlugin_v" + std::to_string(*version)).c_str()));
  why = check_tables(*p);
  if (!why.empty()) refuse(what, path, why);
  return p;
}

// Loads the plugin and runs its init in a child process first: an init that fails, crashes or
// hangs is refused with its reason, and this process never runs it.
void trial(const std::string& what, const std::string& path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    refuse(what, path, "pipe: " + std::string(std::strerror(errno)));
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    refuse(what, path, "fork: " + std::string(std::strerror(errno)));
  }
  if (child == 0) {
    ::close(fds[0]);
    // The host's fault handlers (a sanitizer's, Python's faulthandler) would turn a crash into an
    // exit status; the child dies of the signal itself so the verdict can name it.
    for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
    std::string verdict = "ok";
    try {
      void* handle = nullptr;
      int version = 0;
      const tuttiPlugin_v1_t* p = open_plugin(what, path, &handle, &version);
      if (p->init != nullptr) {
        void* state = nullptr;
        tuttiError_v1_t err{};
        const tuttiResult_t rc = p->init(&state, &err);
        if (rc != TUTTI_OK) {
          err.message[sizeof(err.message) - 1] = '\0';
          verdict = std::string("its init failed (") + to_string(detail::error_code(rc)) +
                    "): " + err.message;
        } else if (p->fini != nullptr) {
          p->fini(state);
        }
      }
    } catch (const Error& e) {
      verdict = e.what();
    }
    (void)!::write(fds[1], verdict.data(), verdict.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string verdict;
  const auto timeout = trial_timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  bool exited = false;
  while (!exited) {
    pollfd p{fds[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50))) > 0) {
      char buf[1024];
      const ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n > 0) verdict.append(buf, static_cast<size_t>(n));
    }
    exited = ::waitpid(child, &status, WNOHANG) == child;
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    ::close(fds[0]);
    refuse(what, path,
           "its init did not return within " + std::to_string(timeout.count()) +
               " ms (tried in a child process; TUTTI_PLUGIN_INIT_TIMEOUT_MS)");
  }
  // What the child wrote is in the pipe by its exit; reading on to end-of-file could wait for
  // good: a process its init forked (without exec) holds the pipe's write end.
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) verdict.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (WIFSIGNALED(status)) {
    refuse(what, path,
           std::string("it crashed while loading or in its init (signal ") +
               std::to_string(WTERMSIG(status)) + ", " + ::strsignal(WTERMSIG(status)) +
               "; tried in a child process)");
  }
  if (verdict != "ok") {
    // The child's words already name the plugin when they come from refuse().
    if (verdict.rfind("plugin ", 0) == 0) throw Error(ErrorCode::kUnavailable, verdict);
    refuse(what, path,
           verdict.empty() ? "the trial child exited with status " +
                                 std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                 " without a word"
                           : verdict);
  }
}

}  // namespace

LoadedPlugin load_plugin(const std::string& path_or_name) {
  std::lock_guard<std::recursive_mutex> lock(loads_mutex());
  const bool was_loading = detail::loading_plugins;
  detail::loading_plugins = true;
  struct Restore {
    bool value;
    ~Restore() { detail::loading_plugins = value; }
  } restore{was_loading};
  const std::string path = resolve(path_or_name);
  const std::string what = "'" + path_or_name + "'";
  for (const auto& l : loaded()) {
    if (l.info.path == path) return l.info;
  }
  trial(what, path);
  auto lib = std::make_shared<PluginLibrary>();
  lib->path = path;
  int version = 0;
  lib->plugin = open_plugin(what, path, &lib->handle, &version);
  const tuttiPlugin_v1_t& p = *lib->plugin;
  lib->name = p.name;
  // Every name checked before anything registers (names ignore case): a refused plugin leaves
  // nothing behind, and a transport another plugin or tutti registered is taken even where it
  // is not available here (cuda_ipc without a GPU).
  std::set<std::string> backends, transports;
  for (size_t i = 0; i < p.num_backends; ++i) {
    if (is_registered_collective_backend(p.backends[i]->name)) {
      refuse(what, path,
             std::string("backend '") + p.backends[i]->name + "' is registered already");
    }
    if (!backends.insert(detail::backend_key(p.backends[i]->name)).second) {
      refuse(
          what, path,
          std::string("it names backend '") + p.backends[i]->name + "' twice (names ignore case)");
    }
  }
  for (size_t i = 0; i < p.num_transports; ++i) {
    if (detail::transport_key(p.transports[i]->name) == "auto") {
      refuse(what, path, "it names a transport 'auto' (PutOptions::transport's own choice)");
    }
    if (detail::transport_name_taken(p.transports[i]->name)) {
      refuse(what, path,
             std::string("transport '") + p.transports[i]->name + "' is registered already");
    }
    if (!transports.insert(detail::transport_key(p.transports[i]->name)).second) {
      refuse(what, path,
             std::string("it names transport '") + p.transports[i]->name +
                 "' twice (names ignore case)");
    }
  }
  if (p.init != nullptr) {
    tuttiError_v1_t err{};
    detail::check_plugin(p.init(&lib->state, &err), err,
                         "plugin '" + lib->name + "' (" + path + "): init");
  }
  LoadedPlugin info;
  info.name = lib->name;
  info.path = path;
  info.abi_version = version;
  for (size_t i = 0; i < p.num_backends; ++i) {
    register_collective_backend(detail::plugin_backend_info(lib, p.backends[i]));
    info.backends.emplace_back(p.backends[i]->name);
  }
  for (size_t i = 0; i < p.num_transports; ++i) {
    register_tensor_transport(detail::plugin_transport_info(lib, p.transports[i]));
    info.transports.emplace_back(p.transports[i]->name);
  }
  loaded().push_back({info, lib});
  TUTTI_LOG_INFO("loaded plugin '{}' ({}, ABI version {})", info.name, path, version);
  return info;
}

void load_plugins_from_env() {
  static std::once_flag once;
  if (detail::loading_plugins) return;
  std::call_once(once, [] {
    const char* list = std::getenv("TUTTI_PLUGINS");
    if (list == nullptr) return;
    std::string s = list;
    size_t start = 0;
    while (start <= s.size()) {
      const size_t end = std::min(s.find(',', start), s.size());
      std::string entry = s.substr(start, end - start);
      entry.erase(0, entry.find_first_not_of(" \t"));
      entry.erase(entry.find_last_not_of(" \t") + 1);
      if (!entry.empty()) {
        try {
          load_plugin(entry);
        } catch (const Error& e) {
          TUTTI_LOG_ERROR("TUTTI_PLUGINS: {}", e.what());
        }
      }
      start = end + 1;
    }
  });
}

std::vector<LoadedPlugin> loaded_plugins() {
  std::lock_guard<std::recursive_mutex> lock(loads_mutex());
  std::vector<LoadedPlugin> out;
  for (const auto& l : loaded()) out.push_back(l.info);
  return out;
}

}  // namespace tutti
