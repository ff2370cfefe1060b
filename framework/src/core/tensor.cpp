#include "ztrain/tensor.h"

namespace ztrain {

std::string Shape::str() const {
  std::string s = "(";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

}  // namespace ztrain
