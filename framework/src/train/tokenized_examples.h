// TokenizedReader: LLaMA-Factory's tokenized_path for the sft source. A
// run (or `ztrain prepare --tokenized`) whose [data] tokenized_path names
// a directory that does not exist reads and encodes its examples as
// usual, then saves them there: the ids and labels (input_ids.bin,
// labels.bin: int32, little-endian, one after another) and
// tokenized.json (each example's start and row, the bad rows, the keys
// that made them, the tokenizer's identity, and every file read with its
// size and CRC-32C). A later run naming the directory loads them instead
// of reading the datasets again, as LLaMA-Factory's does.
//
// Unlike LLaMA-Factory's, which ignores the other data keys once it loads,
// a load is refused where it would train something else: a key that
// shapes the examples (datasets, template, cutoff_len, train_on_prompt,
// mask_history, stage, ...) that differs from the saved one, a tokenizer
// with another identity, or a file read then that has changed, each named
// with what to do. A directory that is not ztrain's (LLaMA-Factory's own
// Arrow save) is refused too. The save is whole or absent: written beside
// the target and renamed into place, so ranks saving at once leave one.
//
// Ownership: borrows the reader it wraps. Thread safety: read may be
// called from any thread. Errors: ConfigError as above; DataError for a
// save that fails or files that are truncated.
#pragma once

#include "ztrain/sft_examples.h"

namespace ztrain {

class TokenizedReader final : public SftReader {
 public:
  explicit TokenizedReader(const SftReader& inner) : inner_(inner) {}
  SftExamples read(const SftRequest& request) const override;

 private:
  const SftReader& inner_;
};

}  // namespace ztrain
