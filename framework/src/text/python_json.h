// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it: ", "
// and ": " between items, keys in their order, non-ASCII kept. LLaMA-
// Factory writes the JSON it puts into text (a tool call in a turn, a
// tool's schema in the system message) this way, so ztrain must write the
// same bytes to train on the same text.
//
// Errors: none. Thread safety: pure.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ztrain::text {

std::string python_dumps(const nlohmann::ordered_json& x);

}  // namespace ztrain::text
