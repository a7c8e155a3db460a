// CollectiveGroup::allocate_symmetric and SymmetricMemory (tutti/collective_group.h).
#include <algorithm>
#include <cstdint>
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

namespace {

std::shared_ptr<void> plain_memory(size_t bytes, const std::string& what) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    throw Error(ErrorCode::kUnavailable,
                what + ": out of memory for " + std::to_string(bytes) + " bytes");
  }
  std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, std::free);
}

// A rank's slot in the exchange: the bytes it asked for, its descriptor's length, then up to
// kDescriptorBytes of it (a length of 0: it has no region).
constexpr size_t kSlot = 8 + 1 + SymmetricRegion::kDescriptorBytes;

}  // namespace

std::shared_ptr<SymmetricMemory> CollectiveGroup::allocate_symmetric(size_t bytes) {
  State& s = *state_;
  const std::string what = "allocate_symmetric on " + describe();
  // A size no rank may have is refused after the exchange, not before: a rank that asked for 0
  // bytes while the others asked for 4096 would leave them waiting in it until their timeout.
  // The exchange names the rank that asked for another size; where all asked for this one, each
  // says why it is refused.
  std::string bad_size;
  // Past any address space (x86-64 maps 128 TiB per process): such a size also wrapped the
  // roundings to pages and cache lines, giving a page of memory that claimed SIZE_MAX bytes.
  constexpr size_t kMaxBytes = size_t{1} << 46;
  if (bytes == 0) {
    bad_size = what + ": bytes is 0";
  } else if (bytes > kMaxBytes) {
    bad_size = what + ": " + std::to_string(bytes) +
               " bytes is more than a process can map (at most " + std::to_string(kMaxBytes) + ")";
  }
  if (!bad_size.empty() && world_size() == 1) throw Error(ErrorCode::kInvalidArgument, bad_size);
  if (s.forked()) throw Error(ErrorCode::kInvalidUsage, what + ": " + s.forked_message());
  if (s.destroyed.load()) {
    throw Error(ErrorCode::kInvalidUsage, what + ": the group was destroyed");
  }
  // Before the backend's region: making one prunes the regions every rank dropped, and an op the
  // abort left queued may still copy from one of them.
  s.throw_if_aborted(what);
  if (!s.device_supported[static_cast<size_t>(DeviceType::kCPU)]) {
    throw Error(ErrorCode::kInvalidUsage, what + ": backend '" + s.backend_name +
                                              "' has no CPU tensors, and symmetric memory is "
                                              "CPU memory");
  }
  // Every rank takes part in the exchange whatever its backend answered (a rank that skipped it
  // would leave the others waiting in it): a rank without a region sends an empty descriptor.
  std::unique_ptr<SymmetricRegion> region;
  std::string failed;  // why this rank has none, where its backend failed to make it
  try {
    std::shared_ptr<Backend> backend = s.current_backend();
    if (backend && bad_size.empty()) region = backend->create_symmetric(bytes);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const std::string mine = region ? region->descriptor() : std::string();
  if (mine.size() > SymmetricRegion::kDescriptorBytes) {
    failed = "backend '" + s.backend_name + "' gave a " + std::to_string(mine.size()) +
             "-byte descriptor";
    region.reset();
  }
  std::vector<uint8_t> slot(kSlot, 0);
  const uint64_t asked = bytes;
  std::memcpy(slot.data(), &asked, 8);
  if (region) {
    slot[8] = static_cast<uint8_t>(mine.size());
    std::memcpy(slot.data() + 9, mine.data(), mine.size());
  }
  std::vector<uint8_t> all(kSlot * static_cast<size_t>(world_size()));
  std::vector<std::string> descriptors;
  std::string without;  // the ranks that have no region
  int with = 0;         // how many have one
  int32_t attached = 0;
  try {
    allgather(TensorView(all), TensorView(slot))->wait();
    for (int r = 0; r < world_size(); ++r) {
      const uint8_t* p = all.data() + kSlot * static_cast<size_t>(r);
      uint64_t theirs = 0;
      std::memcpy(&theirs, p, 8);
      if (theirs != asked) {
        throw Error(ErrorCode::kInvalidArgument,
                    what + ": rank " + std::to_string(r) + " asked for " + std::to_string(theirs) +
                        " bytes, rank " + std::to_string(rank()) + " for " + std::to_string(asked) +
                        ": every rank must ask for the same");
      }
      const size_t len = std::min<size_t>(p[8], SymmetricRegion::kDescriptorBytes);
      descriptors.emplace_back(reinterpret_cast<const char*>(p + 9), len);
      if (len == 0) without += (without.empty() ? "" : ", ") + std::to_string(r);
      with += len > 0;
    }
    if (!bad_size.empty()) throw Error(ErrorCode::kInvalidArgument, bad_size);  // on every rank
    if (without.empty()) {  // every rank has a region: attach them all (every rank alike)
      attached = 1;
      try {
        region->attach(descriptors);
      } catch (const std::exception& e) {
        attached = 0;
        failed = e.what();
      }
    }
    std::vector<int32_t> everyone{attached};
    AllreduceOptions min;
    min.reduce_op = ReduceOp::kMin;
    allreduce(TensorView(everyone), min)->wait();
    attached = everyone[0];
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument) throw;  // already says what
    throw Error(e.code(), what + ": " + e.what());
  }
  if (region) region->commit(attached == 1);
  if (attached != 1 && (with > 0 || !failed.empty())) {
    // Some rank had a region: say why this one is ordinary memory (a backend without symmetric
    // memory anywhere, gloo, says nothing).
    TUTTI_LOG_WARN("{}: ordinary memory, not symmetric: {}", what,
                   !failed.empty()    ? failed
                   : !without.empty() ? "rank(s) " + without + " could not make their part"
                                      : "another rank could not reach the others' parts");
  }
  if (!region) {
    return std::shared_ptr<SymmetricMemory>(
        new SymmetricMemory(nullptr, false, plain_memory(bytes, what), bytes));
  }
  std::shared_ptr<SymmetricMemory> memory(
      new SymmetricMemory(std::move(region), attached == 1, nullptr, bytes));
  if (memory->symmetric()) {
    std::lock_guard<std::mutex> lock(s.symmetric_mutex);
    auto& list = s.symmetric_memory;
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& m) { return m.expired(); }),
               list.end());
    list.push_back(memory);
  }
  return memory;
}

bool CollectiveGroup::is_symmetric(const void* data, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  std::vector<std::weak_ptr<SymmetricMemory>> memory;
  {
    // Copied out: a lock() below that ends up with the last reference frees it outside the lock.
    std::lock_guard<std::mutex> lock(state_->symmetric_mutex);
    memory = state_->symmetric_memory;
  }
  for (const auto& weak : memory) {
    const std::shared_ptr<SymmetricMemory> m = weak.lock();
    if (!m) continue;
    const auto base = reinterpret_cast<uintptr_t>(m->data());
    if (begin >= base && bytes <= m->size() && begin - base <= m->size() - bytes) return true;
  }
  return false;
}

}  // namespace tutti
