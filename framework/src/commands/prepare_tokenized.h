// `ztrain prepare --dataset-dir D --dataset A[,B] --out DIR MODEL_DIR`:
// fine-tuning examples encoded once, ahead of the runs, as LLaMA-Factory's
// tokenized_path saves them: the request sft-check reads (the same
// template, cutoff_len, train_on_prompt and mask_history flags), its ids
// and labels saved in DIR by train/tokenized_examples.h, which a run whose
// [data] tokenized_path = DIR then loads instead of reading the datasets
// (refused there if its keys, tokenizer or files differ). Prints what was
// saved and the [data] keys to train on it; a DIR that holds the same
// examples already is said, not rewritten.
//
// Errors: as the reader's and TokenizedReader's; DataError when no example
// is left. Thread safety: call from the main thread.
#pragma once

#include <ostream>

#include "ztrain/sft_examples.h"

namespace ztrain {

void prepare_tokenized(const SftRequest& request, std::ostream& out);

}  // namespace ztrain
