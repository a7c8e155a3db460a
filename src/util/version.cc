// tutti::version() (tutti/version.h: the single source of the numbers).
#include "tutti/version.h"

namespace tutti {

const char* version() noexcept {
  return TUTTI_VERSION_STRING;
}

}  // namespace tutti
