#include "torch_tensors.h"

#include <c10/util/Exception.h>

namespace tutti::torch_backend {

bool to_dtype(at::ScalarType type, DType& out) {
  switch (type) {
    case at::kBool: out = DType::kBool; return true;
    case at::kChar: out = DType::kInt8; return true;
    case at::kByte: out = DType::kUInt8; return true;
    case at::kInt: out = DType::kInt32; return true;
    case at::kUInt32: out = DType::kUInt32; return true;
    case at::kLong: out = DType::kInt64; return true;
    case at::kUInt64: out = DType::kUInt64; return true;
    case at::kHalf: out = DType::kFloat16; return true;
    case at::kBFloat16: out = DType::kBFloat16; return true;
    case at::kFloat: out = DType::kFloat32; return true;
    case at::kDouble: out = DType::kFloat64; return true;
    default: return false;
  }
}

namespace {

Device tutti_device(const at::Tensor& t) {
  return t.is_cuda() ? Device::cuda(t.device().index()) : Device::cpu();
}

}  // namespace

TensorView view_of(const at::Tensor& t, Use use, const std::string& what) {
  TORCH_CHECK(t.layout() == at::kStrided, "tutti: ", what, ": a ", t.layout(),
              " tensor; tutti moves dense (strided) tensors only");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "tutti: ", what, ": a tensor on ",
              t.device(), "; tutti takes CPU and CUDA tensors");
  DType dtype;
  if (to_dtype(t.scalar_type(), dtype)) {
    return TensorView(t.data_ptr(), dtype, Shape(t.sizes().begin(), t.sizes().end()),
                      tutti_device(t));
  }
  if (t.is_complex() &&
      (t.scalar_type() == at::kComplexFloat || t.scalar_type() == at::kComplexDouble)) {
    // As (real, imaginary) pairs: right for sums and averages, and for moving bytes.
    const DType part = t.scalar_type() == at::kComplexFloat ? DType::kFloat32 : DType::kFloat64;
    return TensorView(t.data_ptr(), part, {t.numel() * 2}, tutti_device(t));
  }
  TORCH_CHECK(use == Use::kMove, "tutti: ", what, ": tutti cannot reduce ", t.scalar_type(),
              " tensors (it reduces bool, int8, uint8, int32, uint32, int64, uint64, float16, "
              "bfloat16, float32, float64, and complex64/128 sums)");
  return TensorView(t.data_ptr(), DType::kUInt8, {static_cast<int64_t>(t.nbytes())},
                    tutti_device(t));
}

Staged stage(const at::Tensor& t) {
  Staged s;
  s.original = t;
  if (t.is_contiguous() && !t.is_conj() && !t.is_neg()) {
    s.work = t;
  } else {
    s.work = t.contiguous().resolve_conj().resolve_neg();
    s.copied = true;
  }
  return s;
}

}  // namespace tutti::torch_backend
