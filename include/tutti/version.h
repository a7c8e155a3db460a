// tutti's version. CMake reads the numbers from this file, so it is the single source of truth.
#pragma once

#include "tutti/export.h"

#define TUTTI_VERSION_MAJOR 0
#define TUTTI_VERSION_MINOR 1
#define TUTTI_VERSION_PATCH 0

#define TUTTI_VERSION_STRING "0.1.0"

namespace tutti {

// The version of the library actually loaded at run time (may differ from the header's).
TUTTI_API const char* version() noexcept;

}  // namespace tutti
