// tutti's logger (internal; used by the core and the backends, never by users; each library
// links its own copy from tutti_util, so no spdlog type crosses a library boundary).
//
// The level comes from TUTTI_LOG_LEVEL (trace, debug, info, warn, error, critical, off;
// default warn). Output goes to stderr. Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

namespace tutti::detail {

spdlog::logger& logger();

}  // namespace tutti::detail

#define TUTTI_LOG_TRACE(...) ::tutti::detail::logger().trace(__VA_ARGS__)
#define TUTTI_LOG_DEBUG(...) ::tutti::detail::logger().debug(__VA_ARGS__)
#define TUTTI_LOG_INFO(...) ::tutti::detail::logger().info(__VA_ARGS__)
#define TUTTI_LOG_WARN(...) ::tutti::detail::logger().warn(__VA_ARGS__)
#define TUTTI_LOG_ERROR(...) ::tutti::detail::logger().error(__VA_ARGS__)
