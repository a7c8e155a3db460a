// torch tensors as tutti's views, for the torch.distributed backend (tutti._torch).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "tutti/tensor_view.h"
#include "tutti/types.h"

namespace tutti::torch_backend {

// How an op uses a tensor's dtype: a reduction needs a dtype tutti reduces; an op that only
// moves bytes (broadcast, gathers, scatters, all-to-all, send/recv) takes any dtype, as bytes.
enum class Use { kReduce, kMove };

// tutti's dtype for a torch dtype; false where tutti has none.
bool to_dtype(at::ScalarType type, DType& out);

// A view of a dense, contiguous tensor (the caller makes it so): its elements, or with kMove
// and a dtype tutti lacks its bytes (uint8). Complex tensors reduce as their real and imaginary
// parts (sums and averages only; `what` names the op in the error otherwise).
TensorView view_of(const at::Tensor& t, Use use, const std::string& what);

// A tensor the op can read and write in place: `t` itself when dense and contiguous, else a
// contiguous copy, whose values are copied back into `t` when the op is done (copy_back).
struct Staged {
  at::Tensor original;
  at::Tensor work;
  bool copied = false;
  void copy_back() const {
    if (copied) original.copy_(work);
  }
};
Staged stage(const at::Tensor& t);

}  // namespace tutti::torch_backend
