#include "group/group_util.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "tutti/types.h"
#include "util/host_identity.h"

namespace tutti::detail {

std::string signature_tail(int devices, int root, int root_tensor, int reduce_op, uint64_t layout) {
  std::string out;
  if (devices != 1) out += " x " + std::to_string(devices) + " devices";
  if (root >= 0) {
    out += " root " + std::to_string(root);
    if (devices != 1 || root_tensor != 0) out += " tensor " + std::to_string(root_tensor);
  }
  if (reduce_op >= 0) out += std::string(" ") + to_string(static_cast<ReduceOp>(reduce_op));
  if (layout != 0) out += " layout " + std::to_string(layout % 100000);
  return out;
}

std::string escape_name(std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {

// Adds "rank 2 (pid 1234)" to a ", "-separated list.
void add_rank(std::string& list, size_t rank, long pid) {
  list += (list.empty() ? "rank " : ", rank ") + std::to_string(rank) + " (pid " +
          std::to_string(pid) + ")";
}

}  // namespace

PeerProcesses::PeerProcesses(const std::vector<long>& pids, const std::vector<uint64_t>& starts,
                             int rank) {
  const size_t n = std::min(pids.size(), starts.size());
  const long me = static_cast<long>(::getpid());  // ranks as threads of this process: not watched
  for (size_t r = 0; r < n; ++r) {
    if (static_cast<int>(r) == rank || pids[r] <= 0 || pids[r] == me || starts[r] == 0) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pids[r]), 0));
    // Compared after the descriptor is taken: it then names the process compared. A start time
    // of 0 is no answer (/proc hidden by hidepid, or a leader thread that ended while its others
    // run): the descriptor's poll says when the process ends. Another start time: the pid was
    // reused, the rank's process is gone.
    const int err = errno;
    const uint64_t start = fd >= 0 ? process_start_time(pids[r]) : 0;
    if (fd < 0 || (start != 0 && start != starts[r])) {
      if (fd >= 0) ::close(fd);
      if (fd >= 0 || err == ESRCH) add_rank(gone_before_, r, pids[r]);
      continue;  // else pidfds are not to be had here (ENOSYS, EPERM): not watched
    }
    fds_.push_back(pollfd{fd, POLLIN, 0});
    ranks_.push_back(static_cast<int>(r));
    pids_.push_back(pids[r]);
  }
}

PeerProcesses::~PeerProcesses() {
  for (const pollfd& p : fds_) ::close(p.fd);
}

std::string PeerProcesses::exited() const {
  std::string out = gone_before_;
  std::vector<pollfd> fds = fds_;
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return out;
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & POLLIN) != 0) add_rank(out, static_cast<size_t>(ranks_[i]), pids_[i]);
  }
  return out;
}

}  // namespace tutti::detail
