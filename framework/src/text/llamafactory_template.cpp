#include "text/llamafactory_template.h"

#include <array>

#include "text/llamafactory_tools.h"
#include "ztrain/error.h"

namespace ztrain::text {

// A registry entry as data/template.py registers it: each formatter's one
// slot ({{content}} where the message goes), the prefix, the default
// system message, and whether it is a ReasoningTemplate.
struct LlamaFactoryFormat {
  std::string_view name;
  std::string_view user, assistant, system, observation;  // a function turn: assistant's slot
  LlamaFactoryTools tools;
  std::string_view default_system;
  std::string_view eos;  // replace_eos: its first stop word becomes the tokenizer's EOS
  bool bos_prefix = false;
  bool reasoning = false;
};

namespace {

constexpr std::string_view kChatmlUser =
    "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n";
constexpr std::string_view kChatmlAssistant = "{{content}}<|im_end|>\n";
constexpr std::string_view kChatmlSystem = "<|im_start|>system\n{{content}}<|im_end|>\n";

constexpr std::string_view kChatmlObservation =
    "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>"
    "assistant\n";
constexpr auto kQwenTools = LlamaFactoryTools::qwen;

const std::array<LlamaFactoryFormat, 4> kFormats{{
    {"llama3",
     "<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     "{{content}}<|eot_id|>", "<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>",
     "<|start_header_id|>ipython<|end_header_id|>\n\n{{content}}<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n",
     LlamaFactoryTools::llama3, "", "<|eot_id|>", true, false},
    {"qwen", kChatmlUser, kChatmlAssistant, kChatmlSystem, kChatmlObservation, kQwenTools,
     "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "<|im_end|>", false,
     false},
    {"qwen3", kChatmlUser, kChatmlAssistant, kChatmlSystem, kChatmlObservation, kQwenTools, "",
     "<|im_end|>", false, true},
    {"qwen3_nothink", kChatmlUser, kChatmlAssistant, kChatmlSystem, kChatmlObservation, kQwenTools,
     "", "<|im_end|>", false, false},
}};

// LLaMA-Factory's default thought_words, and its empty thought.
constexpr std::string_view kThoughtOpen = "<think>\n", kThoughtClose = "\n</think>\n\n";

// StringFormatter.apply: the first `{{name}}` replaced.
std::string fill(std::string slot, std::string_view name, const std::string& value) {
  const std::string key = "{{" + std::string(name) + "}}";
  if (const auto at = slot.find(key); at != std::string::npos) slot.replace(at, key.size(), value);
  return slot;
}

// Template.remove_thought: every "<think>\n ... \n</think>\n\n" (shortest
// match, left to right) removed, then the leading newlines.
std::string without_thoughts(std::string s) {
  std::size_t from = 0;
  while (true) {
    const auto open = s.find(kThoughtOpen, from);
    if (open == std::string::npos) break;
    const auto close = s.find(kThoughtClose, open + kThoughtOpen.size());
    if (close == std::string::npos) break;
    s.erase(open, close + kThoughtClose.size() - open);
    from = open;
  }
  return s.substr(std::min(s.size(), s.find_first_not_of('\n')));
}

bool has_thought(const std::string& s) {
  return s.find("<think>") != std::string::npos || s.find("</think>") != std::string::npos;
}

void append(std::vector<std::int32_t>& to, const std::vector<std::int32_t>& ids) {
  to.insert(to.end(), ids.begin(), ids.end());
}

}  // namespace

std::optional<LlamaFactoryTemplate> LlamaFactoryTemplate::find(
    std::string_view name, const Tokenizer& tokenizer, const std::optional<std::string>& bos_token,
    LlamaFactoryTemplateOptions options) {
  for (const LlamaFactoryFormat& f : kFormats) {
    if (f.name != name) continue;
    std::optional<std::int32_t> bos;
    if (bos_token) {
      bos = tokenizer.token_id(*bos_token);
      if (!bos)
        throw ConfigError("the tokenizer has no token " + *bos_token +
                          ", which tokenizer_config.json names as bos_token; give the model "
                          "directory's own tokenizer");
    }
    return LlamaFactoryTemplate(f, tokenizer, bos_token, bos, options);
  }
  return std::nullopt;
}

std::string LlamaFactoryTemplate::names() {
  std::string out;
  for (const LlamaFactoryFormat& f : kFormats)
    out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

std::string LlamaFactoryTemplate::name() const {
  return std::string(format_->name);
}

std::string LlamaFactoryTemplate::eos() const {
  return std::string(format_->eos);
}

std::string LlamaFactoryTemplate::where() const {
  return "LLaMA-Factory's '" + std::string(format_->name) + "'";
}

namespace {

// _jinja_escape: single quotes escaped.
std::string jinja_escaped(std::string_view text) {
  std::string out;
  for (char c : text) out += c == '\'' ? std::string("\\'") : std::string(1, c);
  return out;
}

// _convert_slots_to_jinja of one slot: its text around {{content}} as
// quoted Jinja strings joined by `+`.
std::string jinja_slot(std::string_view slot, const std::string& placeholder) {
  const auto quoted = [](std::string_view text) { return "'" + jinja_escaped(text) + "'"; };
  const auto at = slot.find("{{content}}");
  std::string out;
  if (at != 0) out += quoted(slot.substr(0, at));
  out += (out.empty() ? "" : " + ") + placeholder;
  if (at + 11 < slot.size()) out += " + " + quoted(slot.substr(at + 11));
  return out;
}

}  // namespace

std::string LlamaFactoryTemplate::default_system() const {
  return options_.default_system.value_or(std::string(format_->default_system));
}

std::string LlamaFactoryTemplate::jinja() const {
  std::string j;
  if (format_->bos_prefix && bos_token_) j += "{{ '" + *bos_token_ + "' }}";
  if (!default_system().empty())
    j += "{% set system_message = '" + jinja_escaped(default_system()) + "' %}";
  j += "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
       "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = "
       "messages %}{% endif %}{% if system_message is defined %}{{ " +
       jinja_slot(format_->system, "system_message") +
       " }}{% endif %}{% for message in loop_messages %}{% set content = message['content'] "
       "%}{% if message['role'] == 'user' %}{{ " +
       jinja_slot(format_->user, "content") + " }}{% elif message['role'] == 'assistant' %}{{ " +
       jinja_slot(format_->assistant, "content") + " }}{% endif %}{% endfor %}";
  return j;
}

// Template._encode for message i: the prefix and system message first,
// then the message through its role's slot, each element tokenized alone.
std::vector<std::int32_t> LlamaFactoryTemplate::message_ids(const SftExample& example,
                                                            std::size_t i,
                                                            const std::string& content) const {
  std::vector<std::int32_t> ids;
  if (i == 0) {
    if (format_->bos_prefix && bos_) ids.push_back(*bos_);
    const std::string system = example.system.empty() ? default_system() : example.system;
    // Any tools column, an empty list too, gives a system message.
    if (!system.empty() || !example.tools.empty()) {
      const std::string tools =
          example.tools.empty() ? std::string() : tools_text(format_->tools, example.tools);
      append(ids,
             tokenizer_->encode(fill(std::string(format_->system), "content", system + tools)));
    }
  }
  const std::string& role = example.turns[i].role;
  const std::string text =
      role == "user"
          ? fill(fill(std::string(format_->user), "content", content), "idx", std::to_string(i / 2))
      : role == "observation" ? fill(std::string(format_->observation), "content", content)
      : role == "function"
          ? fill(std::string(format_->assistant), "content", function_text(format_->tools, content))
          : fill(std::string(format_->assistant), "content", content);
  if (!text.empty()) append(ids, tokenizer_->encode(text));
  return ids;
}

std::vector<TurnPair> LlamaFactoryTemplate::pairs(const SftExample& example,
                                                  bool discard_history_thoughts) const {
  std::vector<std::string> content;
  for (const ChatMessage& m : example.turns) content.push_back(m.content);
  const std::size_t n = content.size();
  const bool reasoning = format_->reasoning, thinking = options_.enable_thinking;
  const bool discard = reasoning && discard_history_thoughts;
  for (std::size_t i = 1; reasoning && !thinking && i < n; i += 2)
    content[i] = without_thoughts(content[i]);
  for (std::size_t i = 1; discard && i + 2 < n; i += 2) content[i] = without_thoughts(content[i]);
  std::vector<std::vector<std::int32_t>> encoded;
  for (std::size_t i = 0; i < n; ++i) encoded.push_back(message_ids(example, i, content[i]));
  const std::vector<std::int32_t> empty =
      reasoning ? tokenizer_->encode(std::string(kThoughtOpen) + std::string(kThoughtClose))
                : std::vector<std::int32_t>();
  for (std::size_t i = discard ? n - 2 : 0; reasoning && i + 1 < n; i += 2) {
    if (has_thought(content[i + 1])) continue;
    if (thinking)
      encoded[i + 1].insert(encoded[i + 1].begin(), empty.begin(), empty.end());
    else
      append(encoded[i], empty);
  }
  std::vector<TurnPair> out;
  for (std::size_t i = 0; i + 1 < n; i += 2) out.push_back({encoded[i], encoded[i + 1]});
  return out;
}

}  // namespace ztrain::text
