// Which machine this process runs on (internal, shared by the core and the CPU backends).
#pragma once

#include <string>

#include "tutti/export.h"

namespace tutti::detail {

// "<hostname>/<boot id>": equal for two processes exactly when they share a running kernel
// (and so can share memory); a host name alone can repeat across machines or containers.
// TUTTI_HOST_ID, when set, replaces it (containers sharing a kernel but not /dev/shm).
TUTTI_API std::string host_identity();

}  // namespace tutti::detail
