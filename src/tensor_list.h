// Helpers over lists of tensors, shared by the backends (internal).
#pragma once

#include <vector>

#include "tutti/tensor_view.h"

namespace tutti::detail {

// True when each tensor starts where the one before ends: the list is one buffer, in order.
inline bool back_to_back(const std::vector<TensorView>& parts) {
  for (size_t i = 1; i < parts.size(); ++i) {
    if (static_cast<const char*>(parts[i].data()) !=
        static_cast<const char*>(parts[i - 1].data()) + parts[i - 1].nbytes()) {
      return false;
    }
  }
  return true;
}

}  // namespace tutti::detail
