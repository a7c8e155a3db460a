// Small helpers shared by the core's group code (internal).
#pragma once

#include <poll.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/hash.h"  // Fnv1a, WordMix

namespace tutti::detail {

// How an op's description ends, after its dtype and shape: " x 2 devices", " root 1" (and
// " tensor 0" with several devices or another tensor), " sum", " layout 12345"; each part only
// where it applies. For OpSignature::str and the op check's fingerprints.
std::string signature_tail(int devices, int root, int root_tensor, int reduce_op, uint64_t layout);

// Percent-encodes every byte outside [A-Za-z0-9._-], so any group name is safe inside a store
// key, a file name or a shared-memory segment name ("a/b" -> "a%2Fb").
std::string escape_name(std::string_view name);

// The processes of a group's other ranks on this host, watched for their exit while the group is
// made (a pidfd each): a rank killed there is seen at once, not at the group's timeout. Only
// ranks whose start time the group knows (`starts`: one host and one pid namespace with this
// process, else 0), so that a pid from another namespace never counts; one whose pid no longer
// names that process when the watch begins has exited already.
class PeerProcesses {
 public:
  PeerProcesses(const std::vector<long>& pids, const std::vector<uint64_t>& starts, int rank);
  ~PeerProcesses();
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  // "rank 2 (pid 1234)" (", "-separated where several) for the watched ranks whose processes
  // have exited, or "".
  std::string exited() const;

 private:
  std::vector<pollfd> fds_;  // copied for each poll: the store's waits may run on several threads
  std::vector<int> ranks_;
  std::vector<long> pids_;
  std::string gone_before_;  // exited before the watch began
};

}  // namespace tutti::detail
