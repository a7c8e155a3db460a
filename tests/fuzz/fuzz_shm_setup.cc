// What the shm backend and the shm transport read from other processes: the affinity masks ranks
// exchange through the store at set-up (backends/shm/shm_cpus.h), a cgroup's cpu.max text, and
// the transport's "chunk" request and "ok" reply (backends/shm/shm_messages.h).
//
// Properties: the masks' CPU count is the popcount of their union, equal to the set's; a
// usable count is at least 1; what the message parsers accept, the writers write back the same.
#include <fuzzer/FuzzedDataProvider.h>
#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "shm_cpus.h"
#include "shm_messages.h"

using namespace tutti::shm_backend;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
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
      const std::string text = in.ConsumeRemainingBytesAsString();
      uint64_t id = 0;
      if (parse_chunk_request(text, id) && chunk_request(id) != text) {
        // Accepted forms are canonical, but for leading zeros.
        uint64_t again = 0;
        if (!parse_chunk_request(chunk_request(id), again) || again != id) std::abort();
      }
      break;
    }
    default: {
      const std::string text = in.ConsumeRemainingBytesAsString();
      uint64_t at = 0, bytes = 0;
      int64_t slot = 0;
      if (parse_chunk_reply(text, at, bytes, slot)) {
        if (bytes == 0) std::abort();
        uint64_t a2 = 0, b2 = 0;
        int64_t s2 = 0;
        if (!parse_chunk_reply(chunk_reply(at, bytes, slot), a2, b2, s2) || a2 != at ||
            b2 != bytes || s2 != slot) {
          std::abort();
        }
      }
      break;
    }
  }
  return 0;
}
