#include "tutti/tensor_view.h"

#include <limits>
#include <sstream>

#include "tutti/error.h"

namespace tutti {

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {
  // The element count, and its size in bytes, must fit an int64 (checked without a division:
  // this runs for every view made).
  int64_t numel = 1;
  bool overflow = false, empty = false;
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t dim = shape_[i];
    if (dim < 0) {
      throw Error(ErrorCode::kInvalidArgument, "tensor shape has a negative dimension " +
                                                   std::to_string(dim) + " at index " +
                                                   std::to_string(i));
    }
    overflow |= __builtin_mul_overflow(numel, dim, &numel);
    empty |= dim == 0;
  }
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(dtype)), &bytes);
  // A zero dimension anywhere makes an empty tensor, whatever the others are.
  if (overflow && !empty) {
    throw Error(ErrorCode::kInvalidArgument, "tensor shape overflows a 64-bit byte count");
  }
  numel_ = empty ? 0 : numel;
  if (data_ == nullptr && numel_ != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "tensor of " + std::to_string(numel_) + " elements has a null data pointer");
  }
}

TensorView TensorView::slice(int64_t offset, int64_t count) const {
  if (offset < 0 || count < 0 || offset + count > numel_) {
    throw Error(ErrorCode::kInvalidArgument,
                "slice [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                    ") is outside a tensor of " + std::to_string(numel_) + " elements");
  }
  auto* base = static_cast<char*>(data_);
  return TensorView(count == 0 ? nullptr : base + offset * static_cast<int64_t>(element_size()),
                    dtype_, {count}, device_);
}

std::string TensorView::str() const {
  std::ostringstream out;
  out << to_string(dtype_) << "[";
  for (size_t i = 0; i < shape_.size(); ++i) out << (i ? ", " : "") << shape_[i];
  out << "] on " << device_.str();
  return out.str();
}

}  // namespace tutti
