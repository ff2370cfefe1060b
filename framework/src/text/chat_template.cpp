#include "text/chat_template.h"

#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <utility>

// minja's header is third-party code with its own warnings; it names
// nlohmann::ordered_json `json` at global scope, here only.
#include <minja/minja.hpp>

#include "text/tokenizer.h"
#include "ztrain/error.h"

namespace ztrain::text {
namespace {

// The special tokens transformers passes to a template: the tokenizer's
// special_tokens_map (tokenizer_config.json's, a string or an AddedToken).
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// tokenizer_config.json's chat_template: a string, or a list of
// {"name", "template"} of which "default" is the one apply_chat_template
// takes.
std::string config_template(const nlohmann::ordered_json& config, const std::string& where) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    throw ConfigError(where +
                      " has no chat_template, and there is no chat_template.jinja beside "
                      "it; give the model directory the template it was trained with");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())
    for (const auto& named : *it)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template"))
        return named["template"].get<std::string>();
  throw ConfigError(where +
                    ": chat_template is neither a string nor a list holding one named "
                    "\"default\"");
}

// strftime_now(format), as transformers gives templates the current date.
minja::Value strftime_now() {
  return minja::simple_function(
      "strftime_now", {"format"}, [](const std::shared_ptr<minja::Context>&, minja::Value& args) {
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[128];
        const std::string format = args.at("format").get<std::string>();
        const std::size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
        return minja::Value(std::string(buf, n));
      });
}

// {% generation %} and {% endgeneration %} (transformers' extension, which
// minja ignores) become blocks that print a marker each, with the tags'
// whitespace control kept: private-use code points no tokenizer text
// holds, found and removed after rendering.
constexpr const char* kOpen = "\xEE\x80\x80";   // U+E000
constexpr const char* kClose = "\xEE\x80\x81";  // U+E001

std::string with_markers(const std::string& text, bool& found) {
  static const std::regex open(R"(\{%(-?)\s*generation\s*(-?)%\})");
  static const std::regex close(R"(\{%(-?)\s*endgeneration\s*(-?)%\})");
  found = std::regex_search(text, open);
  const std::string marked =
      std::regex_replace(text, open, std::string("{%$1 if true %}") + kOpen + "{% endif $2%}");
  return std::regex_replace(marked, close,
                            std::string("{%$1 if true %}") + kClose + "{% endif $2%}");
}

// The text without its markers, and the spans they enclosed.
RenderedChat unmarked(const std::string& text, const std::string& where) {
  RenderedChat out;
  const std::size_t marker = std::char_traits<char>::length(kOpen);
  std::size_t at = 0, open_at = std::string::npos;
  while (at < text.size()) {
    const std::size_t next = text.find("\xEE\x80", at);
    const bool is_marker =
        next != std::string::npos && next + marker <= text.size() &&
        (text.compare(next, marker, kOpen) == 0 || text.compare(next, marker, kClose) == 0);
    if (!is_marker) {
      const std::size_t upto = next == std::string::npos ? text.size() : next + 1;
      out.text.append(text, at, upto - at);
      at = upto;
      continue;
    }
    out.text.append(text, at, next - at);
    const bool opens = text.compare(next, marker, kOpen) == 0;
    if (opens == (open_at != std::string::npos))
      throw ConfigError(where +
                        ": the chat template's {% generation %} blocks are not "
                        "opened and closed in turn");
    if (opens)
      open_at = out.text.size();
    else
      out.answers.emplace_back(open_at, out.text.size()), open_at = std::string::npos;
    at = next + marker;
  }
  if (open_at != std::string::npos)
    throw ConfigError(where + ": a {% generation %} block of the chat template is not closed");
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::size_t common_prefix(const std::string& a, const std::string& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
}

// A JSON list from the data (tools, a turn's tool calls); DataError naming
// `what` for anything else.
json json_list(const std::string& text, const std::string& what) {
  json list = json::parse(text, nullptr, false);
  if (!list.is_array()) throw DataError(what + " is not a JSON list: " + text.substr(0, 80));
  return list;
}

// The function names a list of tool schemas or calls holds: an entry's
// "name", or its "function"'s.
void add_function_names(const json& list, std::vector<std::string>& names) {
  for (const json& entry : list) {
    const json& f = entry.contains("function") ? entry["function"] : entry;
    if (f.is_object() && f.contains("name") && f["name"].is_string())
      names.push_back(f["name"].get<std::string>());
  }
}

// What finds answer i in the text: its content (trimmed, as Llama 3's
// templates trim it), or for a turn that only calls tools, the first
// call's name; empty: nothing to train on.
std::string answer_anchor(const ChatMessage& m) {
  std::string content = trimmed(m.content);
  if (!content.empty() || m.tool_calls.empty()) return content;
  std::vector<std::string> names;
  add_function_names(json::parse(m.tool_calls, nullptr, false), names);
  return names.empty() ? std::string() : names.front();
}

}  // namespace

struct ChatTemplate::Impl {
  ChatTemplateSource source;
  std::shared_ptr<minja::TemplateNode> root;
  bool generation = false;  // the template marks its answers
  // The text with the generation markers, for both render and answers.
  std::string marked(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& tools) const;
};

ChatTemplate::ChatTemplate(ChatTemplateSource source) : impl_(std::make_unique<Impl>()) {
  impl_->source = std::move(source);
  const std::string text = with_markers(impl_->source.text, impl_->generation);
  try {
    impl_->root = minja::Parser::parse(
        text, {.trim_blocks = true, .lstrip_blocks = true, .keep_trailing_newline = false});
  } catch (const std::exception& e) {
    throw ConfigError(impl_->source.where + ": the chat template cannot be parsed: " + e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

const std::string& ChatTemplate::where() const {
  return impl_->source.where;
}

const std::filesystem::path& ChatTemplate::file() const {
  return impl_->source.file;
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir,
                                          const std::filesystem::path& template_file,
                                          std::map<std::string, std::string> variables) {
  ChatTemplateSource source;
  source.variables = std::move(variables);
  const auto config_path = dir / "tokenizer_config.json";
  const auto jinja_path = dir / "chat_template.jinja";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    config = nlohmann::ordered_json::parse(read_file(config_path), nullptr, false);
    if (!config.is_object()) throw ConfigError(config_path.string() + ": not a JSON object");
  }
  if (!template_file.empty()) {
    source.text = read_file(template_file);
    source.where = template_file.string();
    source.file = template_file;
  } else if (std::filesystem::exists(jinja_path)) {
    source.text = read_file(jinja_path);
    source.where = jinja_path.string();
    source.file = jinja_path;
  } else {
    source.text = config_template(config, config_path.string());
    source.where = config_path.string() + ": chat_template";
  }
  for (const char* key : kSpecialTokens)
    if (auto token = config_token(config_path, key)) source.special_tokens[key] = *token;
  return ChatTemplate(std::move(source));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& tools) const {
  return unmarked(impl_->marked(messages, add_generation_prompt, tools), impl_->source.where).text;
}

std::string ChatTemplate::Impl::marked(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt, const std::string& tools) const {
  json values = json::object();
  json list = json::array();
  std::vector<std::string> functions;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.content.find(kOpen) != std::string::npos || m.content.find(kClose) != std::string::npos)
      throw DataError("message " + std::to_string(i + 1) +
                      " holds U+E000 or U+E001, private-use characters ztrain marks answers "
                      "with; remove them from the data");
    json message = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      message["tool_calls"] =
          json_list(m.tool_calls, "message " + std::to_string(i + 1) + "'s tool calls");
      add_function_names(message["tool_calls"], functions);
    }
    list.push_back(std::move(message));
  }
  values["messages"] = std::move(list);
  if (!tools.empty()) {
    values["tools"] = json_list(tools, "the tools");
    add_function_names(values["tools"], functions);
  }
  values["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [key, token] : source.special_tokens) values[key] = token;
  for (const auto& [key, value] : source.variables) {
    if (value == "true" || value == "false")
      values[key] = value == "true";
    else
      values[key] = value;
  }
  auto context = minja::Context::make(minja::Value(values));
  context->set("strftime_now", strftime_now());
  std::string text;
  try {
    text = root->render(context);
  } catch (const std::exception& e) {
    throw ConfigError(source.where + ": the chat template failed on a conversation of " +
                      std::to_string(messages.size()) + " messages: " + e.what());
  }
  for (const std::string& name : functions)
    if (text.find(name) == std::string::npos)
      throw ConfigError(source.where +
                        ": the chat template does not render the conversation's "
                        "tools or tool calls ('" +
                        name +
                        "' is nowhere in its text); give a template that takes tools, as "
                        "apply_chat_template's tools=, or drop the tools column and tool turns");
  return text;
}

// Answer i begins where the conversation before it, rendered with the
// generation prompt, ends (which must begin the whole text). It holds the
// turn's content (trimmed, as Llama 3's templates trim it) and what the
// template closes a turn with: the text after the content when the turn
// is rendered last, as far as the whole text agrees with it (a closing
// only the last turn gets, Phi-3's end-of-text, stays out of earlier
// answers). Before the content the whole may hold less than the turn
// rendered last does (Qwen3 gives only the last turn an empty <think>
// block), never more: a template that drops or rewrites an earlier
// answer once later turns follow is refused, not trained on a wrong span.
// A turn that only calls tools is found by its first call's name instead
// of its content, and runs on through its calls as far as the two agree.
RenderedChat ChatTemplate::render_with_answers(const std::vector<ChatMessage>& messages,
                                               const std::string& tools) const {
  if (impl_->generation)
    return unmarked(impl_->marked(messages, false, tools), impl_->source.where);
  RenderedChat out{render(messages, false, tools), {}};
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::string content = answer_anchor(messages[i]);
    if (content.empty())
      throw DataError("message " + std::to_string(i + 1) +
                      " is an assistant turn with nothing in it: no answer to train on");
    const std::vector<ChatMessage> before(messages.begin(), messages.begin() + i);
    const std::vector<ChatMessage> through(messages.begin(), messages.begin() + i + 1);
    const std::string prompt = render(before, true, tools), last = render(through, false, tools);
    const bool calls_only = trimmed(messages[i].content).empty();
    const std::size_t in_last =
        calls_only ? last.find(content, prompt.size()) : last.rfind(content);
    const std::size_t at = out.text.find(content, prompt.size());
    if (!starts_with(out.text, prompt) || !starts_with(last, prompt) ||
        in_last == std::string::npos || at == std::string::npos ||
        at - prompt.size() > in_last - prompt.size())
      throw ConfigError(impl_->source.where + ": message " + std::to_string(i + 1) +
                        " (an assistant turn) is not where the template renders the "
                        "conversation before it with the generation prompt, or later turns "
                        "change it, so its answer cannot be told apart; give a template whose "
                        "rendering of a conversation begins with that of its first turns");
    const std::size_t after = at + content.size();
    const std::size_t closing =
        common_prefix(last.substr(in_last + content.size()), out.text.substr(after));
    out.answers.emplace_back(prompt.size(), after + closing);
  }
  return out;
}

}  // namespace ztrain::text
