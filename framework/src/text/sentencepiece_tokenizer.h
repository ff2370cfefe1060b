// SentencePieceTokenizer: a SentencePiece .model (Llama 1/2's and
// TinyLlama's tokenizer.model) run by libsentencepiece (Debian's
// libsentencepiece-dev), so its ids are SentencePiece's own; no special
// tokens are added (the caller adds BOS).
//
// Ownership: owns the processor. Errors: DataError when the model does not
// load. Thread safety: SentencePiece's encode and decode are const and may
// run on several threads at once.
#pragma once

#include <filesystem>
#include <memory>

#include "text/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ztrain::text {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& file);
  ~SentencePieceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::size_t vocab_size() const override;
  std::optional<std::int32_t> token_id(const std::string& token) const override;
  std::optional<std::string> bos_token() const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file);

}  // namespace ztrain::text
