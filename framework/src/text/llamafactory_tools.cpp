#include "text/llamafactory_tools.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/python_json.h"
#include "ztrain/error.h"

namespace ztrain::text {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kQwenToolPrompt =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou "
    "are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kQwenToolPromptEnd =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

// Python's str.replace(part, ""): every occurrence removed.
std::string without(std::string s, const std::string& part) {
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at))
    s.erase(at, part.size());
  return s;
}

// The first `open` ... `close` span (shortest), or "".
std::string first_span(const std::string& s, const std::string& open, const std::string& close) {
  const auto a = s.find(open);
  if (a == std::string::npos) return {};
  const auto b = s.find(close, a + open.size());
  return b == std::string::npos ? std::string() : s.substr(a, b + close.size() - a);
}

// _parse_functions: (name, arguments) of each call.
json calls_of(const std::string& text) {
  json calls = function_calls(text);
  for (const json& c : calls)
    if (!c.contains("arguments"))
      throw DataError("a function turn's call has no \"name\" and \"arguments\": " +
                      text.substr(0, 80));
  return calls;
}

std::string written_calls(LlamaFactoryTools format, const json& calls) {
  if (format == LlamaFactoryTools::llama3) {
    json objects = json::array();
    for (const json& c : calls)
      objects.push_back({{"name", c["name"]}, {"parameters", c["arguments"]}});
    return python_dumps(objects.size() == 1 ? objects[0] : objects);
  }
  std::string out;
  for (const json& c : calls)
    out += (out.empty() ? "" : "\n") + std::string("<tool_call>\n") +
           python_dumps(json{{"name", c["name"]}, {"arguments", c["arguments"]}}) +
           "\n</tool_call>";
  return out;
}

}  // namespace

json function_calls(const std::string& content) {
  json calls = json::parse(content, nullptr, false);
  if (calls.is_object()) calls = json::array({calls});
  const auto named = [](const json& c) { return c.is_object() && c.contains("name"); };
  if (!calls.is_array() || calls.empty() || !std::all_of(calls.begin(), calls.end(), named))
    throw DataError(
        "a function turn is not a JSON call {\"name\", \"arguments\"} or a list of "
        "them: " +
        content.substr(0, 80));
  return calls;
}

std::string tools_text(LlamaFactoryTools format, const std::string& tools_json) {
  const json tools = json::parse(tools_json, nullptr, false);
  if (!tools.is_array())
    throw DataError("the tools column is not a JSON list: " + tools_json.substr(0, 80));
  if (tools.empty()) return {};
  if (format == LlamaFactoryTools::llama3)
    throw ConfigError(
        "the row describes tools, which LLaMA-Factory's 'llama3' writes into a prompt with the "
        "day's date (not built: the same row would train different text each day); drop the "
        "tools column from dataset_info.json, or use template \"auto\"");
  std::string text;
  for (const json& tool : tools) {
    const bool wrapped = tool.is_object() && tool.value("type", json()) == "function";
    text += "\n" + python_dumps(wrapped ? tool : json{{"type", "function"}, {"function", tool}});
  }
  return kQwenToolPrompt + text + kQwenToolPromptEnd;
}

std::string function_text(LlamaFactoryTools format, const std::string& content) {
  const std::string call = first_span(content, "<tool_call>", "</tool_call>");
  if (!call.empty()) {
    const std::string inner = call.substr(11, call.size() - 11 - 12);
    return without(content, call) + written_calls(format, calls_of(inner));
  }
  const std::string thought = first_span(content, "<think>\n", "\n</think>\n\n");
  const std::string json_part = thought.empty() ? content : without(content, thought);
  return thought + written_calls(format, calls_of(json_part));
}

}  // namespace ztrain::text
