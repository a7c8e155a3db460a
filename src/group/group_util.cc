#include "group/group_util.h"

#include "tutti/types.h"

namespace tutti::detail {

std::string signature_tail(int devices, int root, int root_tensor, int reduce_op, uint64_t layout) {
  std::string out;
  if (devices != 1) out += " x " + std::to_string(devices) + " devices";
  if (root >= 0) {
    out += " root " + std::to_string(root);
    if (devices != 1 || root_tensor != 0) out += " tensor " + std::to_string(root_tensor);
  }
  if (reduce_op >= 0) out += std::string(" ") + to_string(static_cast<ReduceOp>(reduce_op));
  if (layout != 0) out += " layout " + std::to_string(layout % 100000);
  return out;
}

std::string escape_name(std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace tutti::detail
