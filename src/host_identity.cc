#include "host_identity.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace tutti::detail {

std::string host_identity() {
  // Containers on one kernel can share a boot id but not /dev/shm: let them say who they are.
  if (const char* id = std::getenv("TUTTI_HOST_ID"); id != nullptr && *id != '\0') return id;
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(name) + "/" + boot_id;
}

}  // namespace tutti::detail
