// DLPack import (from_dlpack): a DLTensor whose fields another library, or another process
// through a capsule, filled in. Every field comes from the input; data points into a real
// buffer or is null. A view that comes back must describe what the tensor says (dtype size,
// element count, the byte offset applied); anything else must fail with kInvalidArgument.
#include <dlpack/dlpack.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tutti/dlpack.h"
#include "tutti/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static std::vector<char> buffer(1 << 16);
  DLTensor t{};
  t.data = in.ConsumeBool() ? buffer.data() : nullptr;
  // Any 32-bit value, written as bytes (an out-of-range enum value may not be made by a cast).
  const int32_t device_type = in.ConsumeIntegral<int32_t>();
  std::memcpy(&t.device.device_type, &device_type, sizeof(device_type));
  t.device.device_id = in.ConsumeIntegral<int32_t>();
  t.dtype.code = in.ConsumeIntegral<uint8_t>();
  t.dtype.bits = in.ConsumeIntegral<uint8_t>();
  t.dtype.lanes = in.ConsumeIntegral<uint16_t>();
  t.ndim = in.ConsumeIntegralInRange<int32_t>(-2, 40);
  std::vector<int64_t> shape(static_cast<size_t>(std::max(t.ndim, 0)));
  std::vector<int64_t> strides(shape.size());
  for (auto& d : shape)
    d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 16)
                         : in.ConsumeIntegral<int64_t>();
  const bool with_strides = in.ConsumeBool();
  for (auto& s : strides) s = in.ConsumeIntegral<int64_t>();
  t.shape = shape.empty() && in.ConsumeBool() ? nullptr : shape.data();
  t.strides = with_strides ? strides.data() : nullptr;
  t.byte_offset = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 4096)
                                   : in.ConsumeIntegral<uint64_t>();
  try {
    const tutti::TensorView v = tutti::from_dlpack(t);
    if (v.numel() < 0) std::abort();
    int64_t n = 1;
    bool empty = false, overflow = false;
    for (int64_t d : shape) {
      empty |= d == 0;
      overflow |= __builtin_mul_overflow(n, d, &n);
    }
    if (empty) n = 0;
    if (overflow && !empty) std::abort();  // accepted a shape whose count overflows
    if (v.numel() != n) std::abort();
    const uintptr_t want =
        reinterpret_cast<uintptr_t>(t.data) + static_cast<uintptr_t>(t.byte_offset);
    if (v.numel() > 0 && reinterpret_cast<uintptr_t>(v.data()) != want) std::abort();
  } catch (const tutti::Error& e) {
    if (e.code() != tutti::ErrorCode::kInvalidArgument) std::abort();
  }
  return 0;
}
