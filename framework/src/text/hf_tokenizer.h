// HfTokenizer: text to token ids and back, as a Hugging Face tokenizer.json
// describes it (the file GPT-2, Llama 2 and 3, Mistral, Qwen2 and
// TinyLlama ship beside their weights), giving the ids `tokenizers` gives
// for encode(text, add_special_tokens=False).
//
// What is read: a BPE model (vocab, merges, byte_fallback, fuse_unk,
// ignore_merges, unk_token); the normalizers Prepend, Replace and Sequence;
// the pre-tokenizers ByteLevel, Split, Metaspace and Sequence; the decoders
// ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence;
// added tokens, matched in the text (leftmost, longest) before the rest
// runs; the post-processors TemplateProcessing ("$A" or "<s> $A"),
// ByteLevel and Sequence. Anything else the file asks for (another model,
// NFC, lowercasing, BPE dropout, an added token's lstrip, a template adding
// tokens after the text) is a ConfigError naming its JSON key: never a near
// miss. Each type and option value read is a part of tokenizer_json_parts(),
// and each of those is held to ids the tokenizers package gave (the unit
// test). The post-processor is not applied; callers add the start token
// themselves (bos_token names the token the template begins with).
//
// Thread safety: immutable once loaded; encode and decode from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/bpe.h"
#include "text/pipeline.h"
#include "text/tokenizer.h"

namespace ztrain::text {

// An added token. One with `normalized` is matched in the normalized text
// in its normalized form, which is also what it decodes to (Hugging Face's
// "<mask>" under Llama 2's normalizer is "▁<mask>"); the others as written,
// in the raw text.
struct AddedToken {
  std::string content;
  std::int32_t id;
  bool normalized;
  bool special;
};

// What a tokenizer.json holds, read (tokenizer_json.cpp).
struct TokenizerParts {
  std::optional<BpeModel> model;
  Normalize normalizer;  // empty: none
  PreTokenize pre;       // empty: none
  Decode decoder;        // empty: tokens joined as they are
  std::vector<AddedToken> added;
  std::optional<std::string> template_start;  // post_processor's leading special token
};

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(TokenizerParts parts);

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  // One more than the largest id (model vocabulary and added tokens).
  std::size_t vocab_size() const override { return tokens_.size(); }
  std::optional<std::int32_t> token_id(const std::string& token) const override;
  std::optional<std::string> bos_token() const override { return parts_.template_start; }

 private:
  struct Segment {
    std::string text;
    std::optional<std::int32_t> added;  // an added token's id
    bool at_start;
  };
  std::vector<Segment> split_added(std::string text, bool at_start, bool normalized) const;
  void encode_segment(const Segment& s, std::vector<std::int32_t>& out) const;

  TokenizerParts parts_;
  std::unordered_map<std::string, std::int32_t> names_;  // added tokens as the file writes them
  std::vector<std::string> tokens_;                      // by id
  // The added tokens to try at a position, by the position's byte: their
  // indices in parts_.added, longest first (file order among equal
  // lengths); [0] raw, [1] normalized.
  std::array<std::array<std::vector<std::size_t>, 256>, 2> starting_with_;
};

// Reads a tokenizer.json (ConfigError naming file and key for what is not
// read above, DataError when it cannot be read).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::filesystem::path& file);

// Every part of a tokenizer.json load_hf_tokenizer reads, one name per type
// and option value ("pre_tokenizer Split behavior=Removed"); it refuses
// files using any other.
std::vector<std::string> tokenizer_json_parts();
// The parts FILE uses (it is read as load_hf_tokenizer reads it, errors
// included).
std::set<std::string> tokenizer_json_parts_used(const std::filesystem::path& file);

}  // namespace ztrain::text
