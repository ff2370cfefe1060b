// The data plugin interface.
//
// A DataSource maps a sequence index to T input tokens and their T targets
// (the inputs shifted by one; kIgnoreTarget, -100, where the loss skips a
// position: a prompt, padding, in a source that declares masks),
// deterministically from the seed: sequence g
// of a split is the same whatever the rank, world size or thread asking.
// The host decides which global sequence indices each rank reads for each
// micro-step (see DataLoader), so the global batch does not depend on the
// world size, and a position is just a step count to save and restore.
//
// Errors: setup raises DataError for missing, corrupt or too-short files and
// for token ids >= vocab_size (naming the file and offset), ConfigError for
// unusable options. fill raises DataError for a bad id found while reading.
// Thread safety: after setup, fill may be called from several threads at
// once (the host prefetches on a worker while evaluating on the main thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/plugin.h"
#include "ztrain/sft_examples.h"

namespace ztrain {

enum class Split : std::uint8_t { train, val };

struct DataSetup {
  int seq_len = 0;
  int vocab_size = 0;
  std::uint64_t seed = 0;
  // Whether the run evaluates on the val split: when it does not, a source
  // may hold nothing out (val_fraction = 0), and fill(val) is never called.
  bool evaluates = true;
  // The model directory the run starts from ([model] init_from), where it
  // has one: its tokenizer and chat template are the ones its text means.
  // Empty: none.
  std::string model_dir{};
  // The host's reader of fine-tuning datasets (ztrain/sft_examples.h), for
  // a source that trains on chat examples; null outside a run.
  const SftReader* sft = nullptr;
};

struct DataInfo {
  std::string description;             // one line for the log: "tokens: train.bin, 1.2M tokens"
  std::optional<double> entropy_rate;  // nats/token, where the source knows it
  int vocab_used = 0;                  // ids produced are < vocab_used
  // The files the source reads, as opened. Ranks started on several hosts
  // compare their sizes and sampled contents before training.
  std::vector<std::string> files;
  // Distinct training sequences (one epoch), for a source that has a finite
  // number of them (a file); the host says when a run reads them more than
  // once. Unset: endless (a generator).
  std::optional<std::uint64_t> train_sequences;
  // The same of the validation split, where it is held out (unset: none,
  // or endless); an evaluation that reads more says it repeats them.
  std::optional<std::uint64_t> val_sequences;
  // The tokenizer.json the tokens were made with, where the source knows it
  // (`ztrain prepare`'s manifest names it): exports ship it beside the
  // weights. Empty: none known.
  std::string tokenizer;
  // That tokenizer's identity as the tokens' maker recorded it (16 hex
  // digits of its canonical JSON's hash, `ztrain prepare`'s manifest): a
  // run refuses a model directory whose own tokenizer differs. Empty: not
  // recorded.
  std::string tokenizer_identity;
  // The token id each document starts with (the separator `ztrain prepare`
  // put between documents), where the source knows it: text sampled during
  // training starts from it, as every document the model saw did.
  std::optional<std::int32_t> document_start;
  // Whether targets may be kIgnoreTarget. The host then counts each step's
  // trained targets before it runs (the loss is their mean over the global
  // batch); a source that does not declare masks must not produce one.
  bool masks = false;
  // Whether rows pack several examples: the source gives each token its
  // position in its example (fill_positions), attention never crosses
  // from one example into the next and positions restart with each.
  bool segments = false;
  // The chat template (a .jinja file) the examples were rendered with:
  // exports ship it as chat_template.jinja, so the model chats as it was
  // trained. Empty: none, or tokenizer_config.json's (shipped with it).
  std::string chat_template{};
  // A template with no file (LLaMA-Factory's named ones, as Jinja): an
  // export ships it as chat_template.jinja where the model directory's
  // tokenizer has no template of its own, as LLaMA-Factory's does.
  std::string chat_template_text{};
  // Lines the host prints at start-up under the description: what a user
  // should know about the data (rows skipped, and where).
  std::vector<std::string> notes{};
};

class ZTRAIN_API DataSource : public Plugin {
 public:
  ~DataSource() override;
  virtual void setup(const DataSetup& setup) = 0;
  virtual DataInfo info() const = 0;
  // inputs, targets: (T) each, for global sequence `index` of `split`.
  virtual void fill(Split split, std::uint64_t index, std::int32_t* inputs,
                    std::int32_t* targets) const = 0;
  // positions: (T), of a source that declares segments: each input token's
  // position in its example, 0 where one starts (the first token always),
  // else the previous position + 1. The default raises InternalError: a
  // source without segments is never asked.
  virtual void fill_positions(Split split, std::uint64_t index, std::int32_t* positions) const;
};

}  // namespace ztrain
