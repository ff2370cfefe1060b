// `ztrain sft-check --dataset-dir D --dataset A[,B] DIR`: what a
// fine-tuning run would train on, before it runs. The datasets are read
// as LLaMA-Factory reads them (text/sft_dataset.h), each example rendered
// by the chat template of the model directory DIR and tokenized with its
// tokenizer, cut to cutoff_len with train_on_prompt and mask_history as
// LLaMA-Factory applies them (text/sft_encoding.h). Prints the examples
// read, the bad rows (counted; the first named by file:line), the tokens in
// all and trained, the longest example and how many were truncated, and
// the first example's text with its trained tokens in [[ ]].
//
// Errors: ConfigError / DataError from the dataset, template and
// tokenizer; DataError when no example is left to train on. Thread
// safety: call from the main thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace ztrain {

struct SftCheckArgs {
  std::filesystem::path model_dir;  // tokenizer and chat template
  std::filesystem::path dataset_dir;
  std::vector<std::string> datasets;
  std::size_t cutoff_len = 2048;
  bool train_on_prompt = false;
  bool mask_history = false;
};

void sft_check(const SftCheckArgs& args, std::ostream& out);

}  // namespace ztrain
