// CollectiveGroup::allocate_symmetric and SymmetricMemory (tutti/collective_group.h).
#include <cstdlib>
#include <cstring>
#include <limits>

#include "group/group_state.h"
#include "tutti/backend.h"
#include "tutti/collective_group.h"
#include "util/logging.h"

namespace tutti {

SymmetricMemory::SymmetricMemory(std::unique_ptr<SymmetricRegion> region, bool symmetric,
                                 std::shared_ptr<void> plain, size_t bytes)
    : region_(std::move(region)),
      symmetric_(symmetric && region_ != nullptr),
      plain_(std::move(plain)),
      data_(region_ ? region_->data() : plain_.get()),
      size_(bytes) {}

SymmetricMemory::~SymmetricMemory() = default;

TensorView SymmetricMemory::view(DType dtype, const Shape& shape, size_t byte_offset) const {
  const size_t es = dtype_size(dtype);
  size_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0 || (d > 0 && elements > std::numeric_limits<size_t>::max() / es / d)) {
      throw Error(ErrorCode::kInvalidArgument, "SymmetricMemory::view: dimension " +
                                                   std::to_string(i) + " is " + std::to_string(d));
    }
    elements *= static_cast<size_t>(d);
  }
  const size_t bytes = elements * es;
  if (byte_offset % es != 0 || byte_offset > size_ || bytes > size_ - byte_offset) {
    throw Error(ErrorCode::kInvalidArgument,
                "SymmetricMemory::view: " + std::to_string(bytes) + " bytes of " +
                    to_string(dtype) + " at offset " + std::to_string(byte_offset) +
                    " do not fit its " + std::to_string(size_) + " bytes (or the offset is not a " +
                    "multiple of " + std::to_string(es) + ")");
  }
  return TensorView(static_cast<char*>(data_) + byte_offset, dtype, shape);
}

std::shared_ptr<SymmetricMemory> CollectiveGroup::allocate_symmetric(size_t bytes) {
  State& s = *state_;
  const std::string what = "allocate_symmetric on " + describe();
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, what + ": bytes is 0");
  if (s.forked()) throw Error(ErrorCode::kInvalidUsage, what + ": " + s.forked_message());
  if (s.destroyed.load()) {
    throw Error(ErrorCode::kInvalidUsage, what + ": the group was destroyed");
  }
  std::unique_ptr<SymmetricRegion> region;
  if (std::shared_ptr<Backend> backend = s.current_backend()) {
    region = backend->create_symmetric(bytes);
  }
  if (!region) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      throw Error(ErrorCode::kUnavailable,
                  what + ": out of memory for " + std::to_string(bytes) + " bytes");
    }
    std::memset(p, 0, rounded);
    return std::make_shared<SymmetricMemory>(nullptr, false, std::shared_ptr<void>(p, std::free),
                                             bytes);
  }
  // Every rank's descriptor (a length byte, then up to kDescriptorBytes), through an allgather
  // of the group: recorded, ordered and checked like any op.
  constexpr size_t kSlot = 1 + SymmetricRegion::kDescriptorBytes;
  const std::string mine = region->descriptor();
  if (mine.size() > SymmetricRegion::kDescriptorBytes) {
    throw Error(ErrorCode::kInternal, what + ": backend '" + s.backend_name + "' gave a " +
                                          std::to_string(mine.size()) + "-byte descriptor");
  }
  std::vector<uint8_t> slot(kSlot, 0);
  slot[0] = static_cast<uint8_t>(mine.size());
  std::memcpy(slot.data() + 1, mine.data(), mine.size());
  std::vector<uint8_t> all(kSlot * static_cast<size_t>(world_size()));
  allgather(TensorView(all), TensorView(slot))->wait();
  std::vector<std::string> descriptors;
  for (int r = 0; r < world_size(); ++r) {
    const uint8_t* p = all.data() + kSlot * static_cast<size_t>(r);
    descriptors.emplace_back(reinterpret_cast<const char*>(p + 1),
                             std::min<size_t>(p[0], SymmetricRegion::kDescriptorBytes));
  }
  int32_t attached = 1;
  try {
    region->attach(descriptors);
  } catch (const Error& e) {
    attached = 0;
    TUTTI_LOG_WARN("{}: cannot reach the other ranks' memory, so it is ordinary memory: {}", what,
                   e.what());
  }
  std::vector<int32_t> everyone{attached};
  AllreduceOptions min;
  min.reduce_op = ReduceOp::kMin;
  allreduce(TensorView(everyone), min)->wait();
  region->commit(everyone[0] == 1);
  if (everyone[0] != 1 && attached == 1) {
    TUTTI_LOG_WARN("{}: another rank could not reach this rank's memory: ordinary memory", what);
  }
  return std::make_shared<SymmetricMemory>(std::move(region), everyone[0] == 1, nullptr, bytes);
}

}  // namespace tutti
