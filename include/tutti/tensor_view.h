// TensorView: a non-owning description of a dense tensor (pointer, dtype, shape, device).
//
// A view never owns or copies memory: the caller keeps the buffer alive and unchanged by others
// for the duration of any op it is passed to. Views are cheap value types, safe to copy between
// threads. The CUDA stream an op runs on is an op option, not part of the view.
// Framework tensors (PyTorch, NumPy, CuPy) become views through DLPack: see tutti/dlpack.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/types.h"

namespace tutti {

class TUTTI_API TensorView {
 public:
  TensorView() = default;

  // Throws Error(kInvalidArgument) for a negative dimension, an element count that overflows,
  // or a null data pointer with a non-zero element count (a zero-element view may be null).
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, Device device = Device::cpu());

  // A 1-D view of a whole vector (its elements, not the vector object, are viewed).
  template <typename T, typename = decltype(detail::DTypeOf<T>::value)>
  TensorView(std::vector<T>& values)  // NOLINT(runtime/explicit): views convert implicitly
      : TensorView(values.data(), dtype_of<T>(), {static_cast<int64_t>(values.size())}) {}

  // A 1-D view of count elements of host memory.
  template <typename T, typename = decltype(detail::DTypeOf<std::remove_cv_t<T>>::value)>
  TensorView(T* data, size_t count)
      : TensorView(data, dtype_of<T>(), {static_cast<int64_t>(count)}) {}

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  Device device() const { return device_; }

  int64_t numel() const { return numel_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }

  // A 1-D view of `count` elements starting at element `offset` of this (contiguous) view.
  TensorView slice(int64_t offset, int64_t count) const;

  // "float32[2, 3] on cpu"
  std::string str() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_{0};
  Device device_{};
  int64_t numel_ = 0;
};

}  // namespace tutti
