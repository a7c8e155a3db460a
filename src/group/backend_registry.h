// The registry of backends by name, and what "auto" chooses (internal to the core).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tutti/backend.h"

namespace tutti::detail {

// Lower case: registry keys are case-insensitive.
std::string backend_key(std::string_view name);

// The backend registered under `name`; Error(kUnavailable) naming the registered ones if none.
BackendInfo find_backend(std::string_view name);

// What "auto" means for ranks on these hosts: the available CPU backend of highest priority
// whose scope fits them (ties: the name first in order). Error(kUnavailable) when none does.
BackendInfo choose_auto_backend(const std::vector<std::string>& hosts);

}  // namespace tutti::detail
