#include "tutti/tensor_view.h"

#include <limits>
#include <sstream>

#include "tutti/error.h"

namespace tutti {

TensorView::TensorView(void* data, DType dtype, std::vector<int64_t> shape, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), device_(device) {
  int64_t numel = 1;
  for (size_t i = 0; i < shape_.size(); ++i) {
    const int64_t dim = shape_[i];
    if (dim < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "tensor shape has a negative dimension " + std::to_string(dim) + " at index " +
                      std::to_string(i));
    }
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() /
                                static_cast<int64_t>(dtype_size(dtype)) / dim) {
      throw Error(ErrorCode::kInvalidArgument, "tensor shape overflows a 64-bit byte count");
    }
    numel *= dim;
  }
  numel_ = numel;
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
