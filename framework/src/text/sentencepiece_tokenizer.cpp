#include "text/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstdint>
#include <string_view>

#include "ztrain/error.h"

namespace ztrain::text {
namespace {

// Protocol buffer wire format, as much as model_type needs: a varint.
bool varint(std::string_view& in, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    v |= std::uint64_t{byte & 0x7fu} << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

// The value of varint field `field` of a message (`fallback` when absent),
// or the bytes of length-delimited field `field` (`sub`). False when the
// bytes are not a message.
bool find_field(std::string_view msg, std::uint64_t field, std::uint64_t& value,
                std::string_view* sub) {
  while (!msg.empty()) {
    std::uint64_t key = 0, v = 0;
    if (!varint(msg, key)) return false;
    const std::uint64_t type = key & 7;
    if (type == 0) {
      if (!varint(msg, v)) return false;
      if (!sub && key >> 3 == field) value = v;
    } else if (type == 2) {
      if (!varint(msg, v) || v > msg.size()) return false;
      if (sub && key >> 3 == field) *sub = msg.substr(0, v);
      msg.remove_prefix(v);
    } else if (type == 1 || type == 5) {
      const std::size_t n = type == 1 ? 8 : 4;
      if (n > msg.size()) return false;
      msg.remove_prefix(n);
    } else {
      return false;
    }
  }
  return true;
}

// ModelProto.trainer_spec (field 2).model_type (field 3): UNIGRAM 1 (the
// default), BPE 2, WORD 3, CHAR 4; 0 when unreadable.
std::uint64_t model_type(const std::string& model) {
  std::string_view spec;
  std::uint64_t unused = 0, type = 1;
  if (!find_field(model, 2, unused, &spec) || !find_field(spec, 3, type, nullptr)) return 0;
  return type;
}

}  // namespace

// BPE and Unigram models are held to SentencePiece's own ids (golden.json's
// sp_bpe and sp_unigram); the word and char kinds have no such case.
SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(file.string());
  if (!status.ok())
    throw DataError("cannot load the SentencePiece model '" + file.string() +
                    "': " + status.ToString());
  const std::uint64_t type = model_type(sp_->serialized_model_proto());
  if (type != 1 && type != 2)
    throw ConfigError("the SentencePiece model '" + file.string() + "' is of model_type " +
                      (type == 3   ? std::string("WORD")
                       : type == 4 ? std::string("CHAR")
                                   : std::to_string(type)) +
                      ": ztrain reads BPE and Unigram models, each checked against "
                      "SentencePiece's own ids; use one of those, or the model's tokenizer.json");
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
