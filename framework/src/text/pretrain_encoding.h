// Documents as LLaMA-Factory's pt stage trains them: its
// PretrainDatasetProcessor and transformers' DataCollatorForLanguageModeling.
//
// Each row's text (its first prompt message) gets the end-of-sequence
// token appended as text and is tokenized on its own. Packed (the pt
// default), the documents are concatenated and cut into blocks of
// cutoff_len tokens, the remainder dropped, as `datasets.map` hands the
// processor its rows: in `workers` contiguous shards (preprocessing_num_
// workers; more than the rows: one a row), each in batches of `batch`
// rows (preprocessing_batch_size), a remainder dropped per batch; with
// add_bos_token a block's first token becomes BOS. Unpacked, each
// document (after a BOS where add_bos_token) is cut to cutoff_len. The
// collator trains every token but those equal to the pad token (LLaMA-
// Factory makes the EOS the pad where a tokenizer has none, so there the
// document separators are not trained), as kIgnoreTarget labels.
//
// Errors: none of its own. Thread safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/sft_dataset.h"
#include "text/sft_encoding.h"
#include "text/tokenizer.h"

namespace ztrain::text {

// The tokens the processor and collator use, as LLaMA-Factory fixes them.
struct PretrainTokens {
  std::string eos;                  // appended to each document, as text
  std::string bos;                  // add_bos_token's BOS, as text; empty: none
  std::optional<std::int32_t> pad;  // labels equal to it are not trained
};

struct PretrainEncoding {
  std::size_t cutoff_len = 2048;
  bool packing = true;
  std::size_t workers = 1;   // preprocessing_num_workers (None: 1)
  std::size_t batch = 1000;  // preprocessing_batch_size
};

// One block (packed) or document (unpacked), and the row it begins in.
struct PretrainBlock {
  EncodedExample example;
  std::string where;
};

std::vector<PretrainBlock> pretrain_blocks(const std::vector<SftExample>& rows,
                                           const Tokenizer& tokenizer, const PretrainTokens& tokens,
                                           const PretrainEncoding& options);

}  // namespace ztrain::text
