// BpeModel: byte-pair encoding of one word (a pre-tokenizer's piece) into
// token ids, as Hugging Face tokenizers' BPE model does it.
//
// A word starts as its UTF-8 characters, each the vocabulary's id for it;
// a character the vocabulary lacks becomes its bytes' <0xXX> tokens under
// byte_fallback, else the unknown token (consecutive ones fused into one
// under fuse_unk), else nothing (Hugging Face drops it too). Then the
// adjacent pair of lowest merge rank is merged, the leftmost of equal
// ranks first, until no pair has a merge. With ignore_merges (Llama 3) a
// word that is itself in the vocabulary is that one token.
//
// Thread safety: immutable after construction; encode from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ztrain::text {

struct BpeOptions {
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::optional<std::int32_t> unk;  // the unknown token's id
};

class BpeModel {
 public:
  // vocab: token -> id; merges: pairs of tokens, rank = position. Every
  // merge's parts and result must be in the vocabulary (else ConfigError
  // naming `where` and the merge).
  BpeModel(std::unordered_map<std::string, std::int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& where);

  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  std::optional<std::int32_t> id(const std::string& token) const;
  const std::unordered_map<std::string, std::int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::uint32_t rank;
    std::int32_t result;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }
  void initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  BpeOptions options_;
};

}  // namespace ztrain::text
