// TensorView: a non-owning description of a dense tensor (pointer, dtype, shape, device).
//
// A view never owns or copies memory: the caller keeps the buffer alive and unchanged by others
// for the duration of any op it is passed to. Views are cheap value types, safe to copy between
// threads. The CUDA stream an op runs on is an op option, not part of the view.
// Framework tensors (PyTorch, NumPy, CuPy) become views through DLPack: see tutti/dlpack.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/types.h"

namespace tutti {

// A tensor's dimensions: up to kInline of them held in place (no allocation, so a view is made
// and copied for the price of its bytes), more on the heap. Reads like a const
// std::vector<int64_t> and converts to one.
class TUTTI_API Shape {
 public:
  static constexpr size_t kInline = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }
  Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }  // NOLINT
  Shape(const int64_t* first, const int64_t* last) {
    assign(first, static_cast<size_t>(last - first));
  }
  Shape(const Shape& other) { copy_from(other); }
  Shape(Shape&& other) noexcept { take_from(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) {
      release();
      copy_from(other);
    }
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      release();
      take_from(other);
    }
    return *this;
  }
  ~Shape() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const int64_t* data() const { return heap_ != nullptr ? heap_ : inline_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t front() const { return data()[0]; }
  int64_t back() const { return data()[size_ - 1]; }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  operator std::vector<int64_t>() const { return vec(); }  // NOLINT(runtime/explicit)

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
  friend bool operator==(const Shape& a, const std::vector<int64_t>& b) {
    return a.size_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Shape& a, const std::vector<int64_t>& b) { return !(a == b); }
  friend bool operator==(const std::vector<int64_t>& a, const Shape& b) { return b == a; }
  friend bool operator!=(const std::vector<int64_t>& a, const Shape& b) { return !(b == a); }

 private:
  void assign(const int64_t* dims, size_t n) {
    size_ = n;
    if (n > kInline) {
      heap_ = new int64_t[n];
      std::copy(dims, dims + n, heap_);
    } else {
      std::copy(dims, dims + n, inline_);
    }
  }
  void copy_from(const Shape& other) {
    if (other.heap_ != nullptr) {
      assign(other.heap_, other.size_);
    } else {
      // The whole inline array: a fixed size, no loop (what lies past size_ is never read).
      __builtin_memcpy(inline_, other.inline_, sizeof(inline_));
      size_ = other.size_;
    }
  }
  void take_from(Shape& other) noexcept {
    __builtin_memcpy(inline_, other.inline_, sizeof(inline_));
    size_ = other.size_;
    heap_ = other.heap_;
    other.heap_ = nullptr;
    other.size_ = 0;
  }
  void release() noexcept {
    delete[] heap_;
    heap_ = nullptr;
  }

  int64_t inline_[kInline] = {};
  int64_t* heap_ = nullptr;  // the dimensions, beyond kInline of them
  size_t size_ = 0;
};

class TUTTI_API TensorView {
 public:
  TensorView() = default;

  // Throws Error(kInvalidArgument) for a negative dimension, an element count that overflows,
  // or a null data pointer with a non-zero element count (a zero-element view may be null).
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu());

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
  const Shape& shape() const { return shape_; }
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
  Shape shape_{0};
  Device device_{};
  int64_t numel_ = 0;
};

}  // namespace tutti
