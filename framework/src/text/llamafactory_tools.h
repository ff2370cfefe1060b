// LLaMA-Factory's tool formats for its named templates: what a row's tools
// column adds to the system message (data/tool_utils.py's tool_formatter,
// through formatter.py's ToolFormatter) and how a function turn's calls
// are written (FunctionFormatter with the format's function_formatter).
//
// A function turn holds its calls as JSON ({"name", "arguments"} or a list
// of them), perhaps inside <tool_call> ... </tool_call> (text around it is
// kept in front) or after a "<think>\n ... \n</think>\n\n" thought (kept in
// front); each call is written again as Python's json.dumps writes it
// (text/python_json.h): Qwen's as <tool_call> blocks, Llama 3's as one
// {"name", "parameters"} object (or a list of them).
//
// Errors: DataError for tools or calls that are not such JSON (LLaMA-
// Factory raises on them); ConfigError for Llama 3's tool descriptions,
// whose prompt carries the day's date (not built: the same row would
// train different text every day). Thread safety: pure.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ztrain::text {

enum class LlamaFactoryTools { qwen, llama3 };

// A function turn's calls as LLaMA-Factory's datasets hold them (one
// {"name", ...} object or a list of them) as a JSON list; DataError for
// text that is neither, an empty list, or a call with no "name". Whether
// "arguments" must be there is the caller's: LLaMA-Factory's formatter
// requires it, a chat template's tool_calls default it to {}.
nlohmann::ordered_json function_calls(const std::string& content);

// The tools column's text for the system message; "" for an empty list.
std::string tools_text(LlamaFactoryTools format, const std::string& tools_json);
// A function turn's content as the template's function slot takes it.
std::string function_text(LlamaFactoryTools format, const std::string& content);

}  // namespace ztrain::text
