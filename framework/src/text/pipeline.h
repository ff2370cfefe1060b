// The steps around a tokenizer's model, as Hugging Face's tokenizer.json
// names them: normalizers (text -> text), pre-tokenizers (pieces -> the
// pieces the model encodes one by one) and decoders (tokens -> text). Each
// is a function built from its parameters; tokenizer_json.cpp reads them
// from the file and composes them in the file's order.
//
// Thread safety: every step is immutable once built and may run on
// several threads at once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"

namespace ztrain::text {

// A pre-token: its text, and whether it begins the input (Metaspace's
// "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

using Normalize = std::function<void(std::string&)>;
using PreTokenize = std::function<void(std::vector<Piece>&)>;
using Decode = std::function<void(std::vector<std::string>&)>;

// Normalizers. prepend: `s` before a non-empty text; replace: every `from`.
Normalize prepend_normalizer(std::string s);
Normalize replace_normalizer(std::string from, std::string to);
Normalize sequence_normalizer(std::vector<Normalize> steps);

// Pre-tokenizers. split: each piece cut by the pattern's matches, as
// Split's behaviors keep them (Isolated: matches and the text between them
// each a piece; Removed: the text between; MergedWithPrevious / Next: each
// match joined to the text before / after it).
enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next };
PreTokenize split_pre_tokenizer(std::shared_ptr<const Regex> pattern, SplitBehavior behavior);
// ByteLevel: a space before a piece that lacks one (add_prefix_space),
// GPT-2's split (when `gpt2` is not null), then every byte as its
// ByteLevel character.
PreTokenize byte_level_pre_tokenizer(bool add_prefix_space, std::shared_ptr<const Regex> gpt2);
// Metaspace: spaces become `replacement`, which is put before a piece
// (scheme "always"), before the input's first only ("first") or never;
// `split` cuts before each replacement.
PreTokenize metaspace_pre_tokenizer(std::string replacement, std::string scheme, bool split);
PreTokenize sequence_pre_tokenizer(std::vector<PreTokenize> steps);
// GPT-2's pattern, which ByteLevel's use_regex applies.
const std::string& gpt2_pattern();

// Decoders, over the tokens in order.
Decode byte_level_decoder();
Decode replace_decoder(std::string from, std::string to);
Decode byte_fallback_decoder();
Decode fuse_decoder();
Decode strip_decoder(std::string content, std::size_t start, std::size_t stop);
// Metaspace: replacement characters become spaces, and in the first token
// vanish when `drop_in_first` (the file's scheme is not "never").
Decode metaspace_decoder(std::string replacement, bool drop_in_first);
Decode sequence_decoder(std::vector<Decode> steps);

}  // namespace ztrain::text
