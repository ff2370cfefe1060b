// ChatTemplate: a model's chat template (Jinja), rendered as transformers'
// apply_chat_template renders it, and the spans of a conversation's text
// that are the assistant's answers, for a loss on those alone.
//
// The template is the model directory's own: chat_template.jinja, or
// tokenizer_config.json's "chat_template" (a string, or a list of named
// templates, of which "default" is taken), with the special tokens the
// tokenizer passes to it (bos_token, eos_token, ...). It runs on minja
// (third_party/minja, Google's Jinja engine for chat templates), set as
// transformers sets jinja2: blocks trimmed and left-stripped, no trailing
// newline kept, raise_exception, tojson and strftime_now available.
//
// Tools and tool calls are passed as apply_chat_template passes them
// (tools=, a message's tool_calls); a template that renders them nowhere
// (a function's name missing from its text) is refused, naming the name,
// rather than trained on a conversation without them.
//
// Answers come from the template itself: its {% generation %} blocks
// where it has them (transformers' return_assistant_tokens_mask), else by
// rendering prefixes of the
// conversation: the text before assistant turn i is the conversation up
// to it rendered with the generation prompt, and the answer runs from
// there through the turn's content and the closing the template gives a
// turn it renders last (as far as the whole agrees: a closing only the
// last turn gets stays out of earlier answers). A template whose prompt
// does not begin the whole, or that drops or rewrites an earlier answer
// once later turns follow, is refused, naming the turn; an empty answer
// is a DataError.
//
// Ownership: owns its parsed template. Errors: ConfigError naming the file
// for a template that cannot be parsed or raises, a missing template, or
// answers it does not delimit. Thread safety: immutable once made; render
// from any thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ztrain::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
  // An assistant turn's calls, as transformers' templates take them: a
  // JSON list of {"type": "function", "function": {"name", "arguments"}};
  // empty: none.
  std::string tool_calls{};
};

// Where the template came from (for messages) and what it is given beside
// the messages: the special tokens ("bos_token" -> "<s>") and any other
// variables a run sets (date_string, enable_thinking as "true"/"false").
struct ChatTemplateSource {
  std::string text;
  std::string where;
  std::map<std::string, std::string> special_tokens;
  std::map<std::string, std::string> variables;
  // The .jinja file the text was read from; empty: another source
  // (tokenizer_config.json's chat_template, or text given directly).
  std::filesystem::path file{};
};

// A rendered conversation and its answers: [begin, end) byte offsets into
// text, one per assistant turn, in order.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> answers;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatTemplateSource source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The model directory's template and special tokens; with a
  // template_file, that file's template instead (a base model's directory
  // has none); variables as ChatTemplateSource's.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir,
                                     const std::filesystem::path& template_file = {},
                                     std::map<std::string, std::string> variables = {});

  // The conversation as text; with the generation prompt, ready for the
  // assistant's next answer. tools: the functions it may call, a JSON list
  // of schemas passed as apply_chat_template's tools (empty: none).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& tools = {}) const;
  // The whole conversation, and where each assistant answer lies in it.
  RenderedChat render_with_answers(const std::vector<ChatMessage>& messages,
                                   const std::string& tools = {}) const;
  const std::string& where() const;
  const std::filesystem::path& file() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::text
