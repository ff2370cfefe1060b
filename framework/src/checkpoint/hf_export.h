// What an exported model directory holds beside its weights, so that
// transformers' AutoModelForCausalLM and AutoTokenizer load it as it is:
// config.json with the weights' true torch_dtype and token ids that are in
// the vocabulary or null (transformers' defaults, GPT-2's 50256 and Llama's
// 1 and 2, would point outside a small vocabulary), the tokenizer the
// run's tokens came from (tokenizer.json, with tokenizer_config.json and
// special_tokens_map.json when they are beside it) and the chat template
// its examples were rendered with (chat_template.jinja).
//
// Errors: DataError for files that cannot be read or written; ConfigError
// for a tokenizer that does not load. Thread safety: one thread.
#pragma once

#include <filesystem>
#include <string>

#include "ztrain/dtype.h"

namespace ztrain {

// `config_json` (a model's config.json) with torch_dtype = `dtype` and
// bos_token_id / eos_token_id those of `tokenizer` (a tokenizer.json;
// empty: none, and both null): tokenizer_config.json's bos_token and
// eos_token beside it, else the post-processor's leading token as BOS.
std::string export_config_json(const std::string& config_json, DType dtype,
                               const std::filesystem::path& tokenizer);

// The text files an export ships beside the weights.
struct TextFiles {
  std::filesystem::path tokenizer;  // tokenizer.json or a SentencePiece .model; empty: none
  // A .jinja file, shipped as chat_template.jinja; empty: the one beside
  // the tokenizer, where there is one.
  std::filesystem::path chat_template{};
  // A template with no file, shipped where the tokenizer has none of its
  // own (no chat_template.jinja beside it, none in tokenizer_config.json).
  std::string chat_template_text{};
};

// Copies the tokenizer (as tokenizer.json, or tokenizer.model for a
// SentencePiece model), the tokenizer files beside it and the chat
// template into `dir`.
void copy_text_files(const TextFiles& files, const std::filesystem::path& dir);

}  // namespace ztrain
