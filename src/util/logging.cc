#include "util/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace tutti::detail {

spdlog::logger& logger() {
  // Leaked on purpose: groups torn down at exit still log, after other statics are gone.
  static spdlog::logger* instance = [] {
    auto* l = new spdlog::logger("tutti", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [tutti] [%l] [pid %P] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (const char* env = std::getenv("TUTTI_LOG_LEVEL"); env != nullptr && *env != '\0') {
      level = spdlog::level::from_str(env);  // unknown text reads as "off"
    }
    l->set_level(level);
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *instance;
}

}  // namespace tutti::detail
