// What the shm backend and the shm transport read from other processes: the affinity masks ranks
// exchange through the store at set-up (backends/shm/shm_cpus.h), a cgroup's cpu.max text, and
// the transport's block request and reply and the backend's symmetric-memory descriptor
// (backends/shm/shm_messages.h).
//
// Properties: the masks' CPU count is the popcount of their union, equal to the set's; a
// usable count is at least 1; what the message parsers accept (anything else is a tutti::Error),
// the writers write back byte for byte.
#include <fuzzer/FuzzedDataProvider.h>
#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "shm_cpus.h"
#include "shm_messages.h"
#include "tutti/error.h"

using namespace tutti::shm_backend;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: {
      std::vector<std::string> masks;
      const int n = in.ConsumeIntegralInRange<int>(0, 8);
      for (int i = 0; i < n; ++i) masks.push_back(in.ConsumeRandomLengthString(300));
      const int count = cpus_in_union(masks);
      const cpu_set_t set = mask_union(masks);
      // The set may fall back to this process's mask when the union is empty.
      if (count > 0 && CPU_COUNT(&set) != count) std::abort();
      if (usable_cpus(count, in.ConsumeFloatingPoint<double>(), 2) < 1) std::abort();
      break;
    }
    case 1: {
      const double cpus = cpu_max_cpus(in.ConsumeRemainingBytesAsString());
      if (cpus < 0) std::abort();
      break;
    }
    case 2: {
      const std::string bytes = in.ConsumeRemainingBytesAsString();
      try {
        if (block_request(parse_block_request(bytes)) != bytes) std::abort();
      } catch (const tutti::Error&) {
      }
      break;
    }
    case 4: {
      const std::string bytes = in.ConsumeRemainingBytesAsString();
      try {
        const SymmetricDescriptor d = parse_symmetric_descriptor(bytes);
        if (d.bytes == 0 || d.name.find('/', 1) != std::string::npos ||
            symmetric_descriptor(d) != bytes) {
          std::abort();
        }
      } catch (const tutti::Error&) {
      }
      break;
    }
    default: {
      const std::string bytes = in.ConsumeRemainingBytesAsString();
      try {
        const BlockReply reply = parse_block_reply(bytes);
        if (reply.bytes == 0 || block_reply(reply) != bytes) std::abort();
      } catch (const tutti::Error&) {
      }
      break;
    }
  }
  return 0;
}
