// Fine-tuning examples, as token ids and labels, for a data plugin.
//
// The host lends a data source (DataSetup::sft) a reader of LLaMA-Factory's
// datasets: dataset_dir/dataset_info.json names each dataset's file and
// format (alpaca, sharegpt, openai), every row is rendered through a chat
// template (the model directory's own, or a .jinja file) and tokenized by
// the model directory's tokenizer, or encoded by one of LLaMA-Factory's
// named templates as its own code encodes it, and cut and masked as LLaMA-Factory's
// supervised preprocessing does (cutoff_len, train_on_prompt,
// mask_history). A source decides only how examples become rows (padded,
// packed, shuffled, held out); the text machinery (the Jinja engine, the
// tokenizers and their libraries) stays in the host.
//
// labels are aligned with input_ids, as Hugging Face's are: a model
// predicting token t + 1 from tokens 0..t is trained on labels[t + 1];
// kIgnoreTarget (-100) where nothing is trained (the prompt, the history).
//
// A row that breaks its format or has nothing left to train on once cut
// is not an example: it is counted in bad_rows, and the first ones are
// named (file:line and what is wrong), never dropped unsaid.
//
// Ownership: SftExamples is a value. Errors: read raises ConfigError for
// a dataset dataset_info.json does not name (or that needs the hub), a
// model directory with no tokenizer or chat template, a template that
// cannot be parsed or raises, a template name ztrain does not build; DataError, naming the file,
// for files that cannot be read. Thread safety: read may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

// LLaMA-Factory's pt stage: each row's text and the EOS as one document,
// every token trained but the pad; packed (its default), the documents of
// each preprocessing batch concatenated and cut into cutoff_len blocks,
// the remainder dropped, as its PretrainDatasetProcessor and datasets'
// map(batched, num_proc) cut them.
struct SftPretrain {
  bool on = false;
  bool packing = true;
  std::size_t workers = 1;   // preprocessing_num_workers: contiguous shards
  std::size_t batch = 1000;  // preprocessing_batch_size: rows a batch
};

struct SftRequest {
  std::string dataset_dir;
  std::vector<std::string> datasets;  // dataset_info.json's names, concatenated in order
  std::string model_dir;              // its tokenizer and, with "auto", its chat template
  // "auto", a .jinja file, or a LLaMA-Factory template's name ("llama3")
  std::string chat_template = "auto";
  std::size_t cutoff_len = 2048;  // tokens an example keeps at most
  bool train_on_prompt = false;
  bool mask_history = false;
  // Each dataset's first max_samples rows (LLaMA-Factory's max_samples);
  // 0: all. dataset_info.json's num_samples draws from `seed`.
  std::size_t max_samples = 0;
  std::uint64_t seed = 0;
  // LLaMA-Factory's enable_thinking, for its reasoning templates (qwen3).
  bool enable_thinking = true;
  // Where chat_template was set (file:line:col), for the reader's messages.
  std::string template_where;
  // LLaMA-Factory's pt stage: documents, not conversations.
  SftPretrain pretrain{};
  // LLaMA-Factory's tokenized_path: the examples saved there by an earlier
  // read with the same keys, or saved there by this one; empty: none.
  std::string tokenized_path{};
  // LLaMA-Factory's default_system: a named template's default system
  // message replaced (refused with a Jinja template, whose own decides).
  std::optional<std::string> default_system{};
};

struct SftExamples {
  // Every example's ids and labels, one after another: example i is
  // [starts[i], starts[i + 1]).
  std::vector<std::int32_t> input_ids;
  std::vector<std::int32_t> labels;
  std::vector<std::size_t> starts{0};
  std::vector<std::string> where;  // file:line of each example's row
  std::size_t bad_rows = 0;
  std::vector<std::string> bad;  // the first bad rows: "file:line: what is wrong"
  // What was read: dataset_info.json, the data files, the tokenizer and
  // the template (ranks on several hosts compare them).
  std::vector<std::string> files;
  std::string tokenizer;           // the tokenizer file
  std::string tokenizer_identity;  // its identity (DataInfo::tokenizer_identity)
  std::string chat_template;       // where the template came from
  std::string chat_template_file;  // the .jinja file it is; empty: tokenizer_config.json's
  // A LLaMA-Factory named template as the Jinja it writes into a tokenizer
  // that has none; empty: the examples came through a Jinja template.
  std::string chat_template_text{};

  std::size_t count() const { return starts.size() - 1; }
  std::size_t length(std::size_t i) const { return starts[i + 1] - starts[i]; }
};

class ZTRAIN_API SftReader {
 public:
  virtual ~SftReader();
  virtual SftExamples read(const SftRequest& request) const = 0;
};

}  // namespace ztrain
