#include "text/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "ztrain/error.h"

namespace ztrain::text {

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(file.string());
  if (!status.ok())
    throw DataError("cannot load the SentencePiece model '" + file.string() +
                    "': " + status.ToString());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw DataError("SentencePiece cannot encode the text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw DataError("SentencePiece cannot decode the ids: " + status.ToString());
  return text;
}

std::size_t SentencePieceTokenizer::vocab_size() const {
  return static_cast<std::size_t>(sp_->GetPieceSize());
}

// PieceToId gives the unknown token's id for a piece the model lacks.
std::optional<std::int32_t> SentencePieceTokenizer::token_id(const std::string& token) const {
  const int id = sp_->PieceToId(token);
  if (id == sp_->unk_id() && token != sp_->IdToPiece(sp_->unk_id())) return std::nullopt;
  return id;
}

std::optional<std::string> SentencePieceTokenizer::bos_token() const {
  if (sp_->bos_id() < 0) return std::nullopt;
  return sp_->IdToPiece(sp_->bos_id());
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file) {
  return std::make_unique<SentencePieceTokenizer>(file);
}

}  // namespace ztrain::text
