#include "util/host_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

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

uint64_t process_start_time(long pid) {
  // With read(2), not a stream: a process that exits between the open and the read fails the
  // read (ESRCH), which libstdc++'s filebuf throws from where no stream catches it (a fresh-clone
  // run's rank died of that, std::terminate, while a peer exited). Gone: not live.
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string text;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (n < 0) return 0;
  const auto paren = text.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 > text.size()) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    // A zombie (exited, not yet reaped by its parent) is no live process.
    if (i == 3 && (field == "Z" || field == "X")) return 0;
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

uint64_t pid_namespace() {
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace tutti::detail
