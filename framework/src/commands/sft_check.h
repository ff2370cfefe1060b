// `ztrain sft-check --dataset-dir D --dataset A[,B] DIR`: what a
// fine-tuning run would train on, before it runs, read by the reader the
// run's sft data source is lent (text/sft_reader.h): the datasets as
// LLaMA-Factory reads them, each example rendered by the chat template of
// the model directory DIR (or --template FILE) and tokenized with its
// tokenizer, cut to cutoff_len with train_on_prompt and mask_history as
// LLaMA-Factory applies them. Prints the examples
// read, the bad rows (counted; the first named by file:line), the tokens in
// all and trained, the longest example and how many were truncated, and
// the first example's text with its trained tokens in [[ ]].
//
// Errors: ConfigError / DataError from the dataset, template and
// tokenizer; DataError when no example is left to train on. Thread
// safety: call from the main thread.
#pragma once

#include <ostream>

#include "ztrain/sft_examples.h"

namespace ztrain {

void sft_check(const SftRequest& request, std::ostream& out);

}  // namespace ztrain
