// Loading plugins (tutti/plugin.h) from C++: the same road TUTTI_PLUGINS takes.
//
// Threads: any thread; loads are serialised. Errors: tutti::Error(kUnavailable) naming the
// plugin, its path and why (not found, no tuttiPlugin_v<N> this tutti takes and which it has,
// a backend or transport missing a required function, a name already registered, an init that
// failed or crashed); nothing of a refused plugin is registered, and tutti stays usable.
#pragma once

#include <string>
#include <vector>

#include "tutti/export.h"

namespace tutti {

struct LoadedPlugin {
  std::string name;  // the plugin's own (tuttiPlugin_vN::name)
  std::string path;  // the shared object's
  int abi_version = 0;
  std::vector<std::string> backends;    // registered collective backends
  std::vector<std::string> transports;  // registered tensor transports
};

// Loads one plugin: a path (with a '/'), or a name looked up as libtutti-plugin-<name>.so on
// TUTTI_PLUGIN_PATH (colon-separated directories), then by the dynamic loader's own search.
// Loading the same shared object again returns what the first load registered.
TUTTI_API LoadedPlugin load_plugin(const std::string& path_or_name);

// The plugins TUTTI_PLUGINS names (comma-separated), once per process; a plugin that fails is
// logged as an error and skipped. The registries call this on their first lookup.
TUTTI_API void load_plugins_from_env();

TUTTI_API std::vector<LoadedPlugin> loaded_plugins();

}  // namespace tutti
