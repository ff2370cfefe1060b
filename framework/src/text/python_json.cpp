#include "text/python_json.h"

#include <nlohmann/json.hpp>

namespace ztrain::text {

std::string python_dumps(const nlohmann::ordered_json& x) {
  std::string out;
  if (x.is_object()) {
    for (auto it = x.begin(); it != x.end(); ++it)
      out += (out.empty() ? "{" : ", ") + nlohmann::ordered_json(it.key()).dump() + ": " +
             python_dumps(it.value());
    return out.empty() ? "{}" : out + "}";
  }
  if (x.is_array()) {
    for (const auto& e : x) out += (out.empty() ? "[" : ", ") + python_dumps(e);
    return out.empty() ? "[]" : out + "]";
  }
  return x.dump();
}

}  // namespace ztrain::text
