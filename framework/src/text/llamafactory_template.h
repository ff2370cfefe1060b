// LlamaFactoryTemplate: one of LLaMA-Factory's own named chat templates
// (its data/template.py registry: `template: llama3` in a training YAML),
// encoding a fine-tuning example into (prompt, answer) token pairs exactly
// as its Template.encode_multiturn does.
//
// LLaMA-Factory does not render the model's Jinja template. Each message
// goes through a formatter's slots ("<|im_start|>user\n{{content}}..."),
// the first also gets the prefix (llama3's BOS) and the system message (the
// template's default where the example has none), and every element is
// tokenized on its own. A reasoning template (qwen3) adds an empty thought,
// "<think>\n\n</think>\n\n" tokenized alone, to every answer that has none:
// trained, or with enable_thinking off put at the end of the prompt after
// every thought is removed; with history discarded (mask_history) the
// earlier answers lose their thoughts and only the last gets an empty one.
//
// Tools go as its ToolFormatter writes them after the system message (a
// tools column, an empty list too, gives the first message a system
// message); function turns through the template's function formatter and
// observations through its observation slot (text/llamafactory_tools.h;
// llama3's tool descriptions, which carry the day's date, are refused).
//
// Only the templates whose ids are held to LLaMA-Factory's own code by
// tests/data/llamafactory/template_golden.json are built (find() answers
// nullptr for the rest, so the caller refuses them by name).
//
// Ownership: the registry is static; a template holds the BOS id of the
// tokenizer it was made for. Thread safety: immutable; encode from any
// thread. Errors: ConfigError as above, and for a BOS the tokenizer lacks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/sft_dataset.h"
#include "text/tokenizer.h"

namespace ztrain::text {

// One turn's prompt and answer ids, before truncation.
struct TurnPair {
  std::vector<std::int32_t> source, target;
};

struct LlamaFactoryFormat;  // one registry entry's slots and behaviour

// LLaMA-Factory's data arguments that change what a template encodes.
struct LlamaFactoryTemplateOptions {
  bool enable_thinking = true;  // reasoning templates only
  // default_system: replaces the template's default system message.
  std::optional<std::string> default_system{};
};

class LlamaFactoryTemplate {
 public:
  // The named template for `tokenizer`, whose BOS token is bos_token (a
  // model directory's tokenizer_config.json's, as transformers reads it);
  // nullopt where ztrain does not build that name.
  static std::optional<LlamaFactoryTemplate> find(std::string_view name, const Tokenizer& tokenizer,
                                                  const std::optional<std::string>& bos_token,
                                                  LlamaFactoryTemplateOptions options = {});
  // The names built, comma-separated, for messages.
  static std::string names();
  std::string name() const;
  // The tokenizer's EOS once the template has fixed it (replace_eos: its
  // first stop word), which is also the pad where the tokenizer has none.
  std::string eos() const;

  // encode_multiturn: one pair per answer; discard_history_thoughts is
  // LLaMA-Factory's mask_history without preserve_thinking.
  std::vector<TurnPair> pairs(const SftExample& example, bool discard_history_thoughts) const;
  // "LLaMA-Factory's 'qwen3'", for messages and the run's header.
  std::string where() const;
  // The template as Jinja, as its fix_jinja_template writes one into a
  // tokenizer that has none (Template._get_jinja_template): the prefix,
  // the default system message, system, user and assistant turns.
  std::string jinja() const;

 private:
  LlamaFactoryTemplate(const LlamaFactoryFormat& format, const Tokenizer& tokenizer,
                       std::optional<std::string> bos_token, std::optional<std::int32_t> bos,
                       LlamaFactoryTemplateOptions options)
      : format_(&format),
        tokenizer_(&tokenizer),
        bos_token_(std::move(bos_token)),
        bos_(bos),
        options_(options) {}
  std::vector<std::int32_t> message_ids(const SftExample& example, std::size_t i,
                                        const std::string& content) const;
  std::string default_system() const;
  const LlamaFactoryFormat* format_;
  const Tokenizer* tokenizer_;
  std::optional<std::string> bos_token_;
  std::optional<std::int32_t> bos_;
  LlamaFactoryTemplateOptions options_;
};

}  // namespace ztrain::text
