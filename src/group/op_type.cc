#include "tutti/op_type.h"

#include "group/group_util.h"
#include "util/deadline.h"

namespace tutti {

const char* to_string(OpType op) noexcept {
  switch (op) {
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllreduce: return "allreduce";
    case OpType::kReduce: return "reduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kAlltoallv: return "alltoallv";
    case OpType::kAllgatherv: return "allgatherv";
    case OpType::kGather: return "gather";
    case OpType::kScatter: return "scatter";
    case OpType::kBatchP2P: return "batch_isend_irecv";
    case OpType::kCount: break;
  }
  return "unknown";
}

std::string OpSignature::str() const {
  std::string out = to_string(op);
  if (op == OpType::kBarrier) return out;
  out += std::string(" ") + to_string(dtype) + "[" + std::to_string(count) + "]";
  return out + detail::signature_tail(devices, root, root_tensor, reduce_op, layout);
}

uint64_t OpSignature::hash() const {
  // Every field, packed into as few words as they fit (this runs for every op): the small ones
  // in one, the count, and the rarely set ones only where set.
  const uint64_t small = static_cast<uint64_t>(op) | static_cast<uint64_t>(dtype) << 8 |
                         static_cast<uint64_t>(static_cast<uint8_t>(reduce_op)) << 16 |
                         static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32;
  detail::WordMix h;
  h.mix(small).mix(static_cast<uint64_t>(count));
  const bool plain_devices = devices == 1 && root_tensor == 0 && reduce_op >= -1 && reduce_op < 255;
  if (!plain_devices) {
    h.mix(static_cast<uint64_t>(static_cast<uint32_t>(devices)) << 32 |
          static_cast<uint32_t>(root_tensor))
        .mix(static_cast<uint64_t>(static_cast<int64_t>(reduce_op)));
  }
  if (layout != 0) h.mix(layout);
  return h.value();
}

std::string OpContext::description() const {
  return std::string(to_string(op)) + " #" + std::to_string(seq) + " on group '" +
         (group_name ? *group_name : std::string("?")) + "' (rank " + std::to_string(rank) + "/" +
         std::to_string(world_size) + ")";
}

std::chrono::steady_clock::time_point OpContext::deadline() const {
  if (started == std::chrono::steady_clock::time_point{}) return deadline_after(timeout);
  return detail::deadline_after(timeout, started);
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return detail::deadline_after(timeout);
}

}  // namespace tutti
