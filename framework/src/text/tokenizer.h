// Tokenizer: text to token ids and back, whatever file describes it: a
// Hugging Face tokenizer.json (text/hf_tokenizer.h: ids equal to the
// `tokenizers` library's) or a SentencePiece .model
// (text/sentencepiece_tokenizer.h: through libsentencepiece itself).
// `ztrain prepare` writes what encode gives; `ztrain sample` and exports
// read ids back with decode.
//
// Ownership: load_tokenizer returns the only owner. Errors: ConfigError for
// a file that asks for what is not built (naming the key), DataError for
// one that cannot be read. Thread safety: immutable once loaded; encode
// and decode from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ztrain::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text` with no special tokens added (the caller adds BOS).
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  // One more than the largest id.
  virtual std::size_t vocab_size() const = 0;
  virtual std::optional<std::int32_t> token_id(const std::string& token) const = 0;
  // The token a sequence starts with, where the file says (a
  // tokenizer.json's post-processor template, a SentencePiece model's
  // bos_id); nullopt where it does not.
  virtual std::optional<std::string> bos_token() const = 0;
};

// A tokenizer.json, or a SentencePiece model (a .model file).
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file);

// The identity of the tokenizer in `file`, as 16 hex digits: a hash of a
// tokenizer.json's canonical JSON (keys sorted, no whitespace: the same
// tokenizer however it is formatted) or of a SentencePiece model's bytes.
// `ztrain prepare` records it beside the shards; a run compares it with the
// model directory's tokenizer. DataError for a file that cannot be read.
std::string tokenizer_identity(const std::filesystem::path& file);

// The tokenizer a model directory holds: tokenizer.json, else
// tokenizer.model; empty when it has neither.
std::filesystem::path tokenizer_in(const std::filesystem::path& dir);

// The token the tokenizer_config.json beside `file` names under `key`
// ("bos_token", "eos_token"; a string or {"content": ...}); nullopt when
// there is no such file or key.
std::optional<std::string> config_token(const std::filesystem::path& file, const char* key);
// The same file's boolean `key` ("add_bos_token"); false where absent.
bool config_flag(const std::filesystem::path& file, const char* key);

// The token a document starts with for the tokenizer in `file`: the
// template's leading token, else tokenizer_config.json's bos_token, else its
// eos_token (GPT-2 and Qwen2 start each document with <|endoftext|>).
// `ztrain prepare` puts it between documents; samples during training start
// from it, as the model saw every document start.
std::optional<std::string> document_start(const Tokenizer& tok, const std::filesystem::path& file);

}  // namespace ztrain::text
