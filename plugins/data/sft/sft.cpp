// sft: supervised fine-tuning on LLaMA-Factory's datasets. The host's
// reader (ztrain/sft_examples.h) gives each example's token ids and
// labels, rendered by the model directory's chat template, cut and masked
// with LLaMA-Factory's cutoff_len, train_on_prompt and mask_history; this
// source only lays them out in rows: one example a row, from its start,
// the rest of the row padded with targets the loss skips.
//
// A row of seq_len T holds an example of up to T + 1 tokens: its first
// L - 1 tokens are the inputs and labels 1..L-1 the targets (the model
// predicting token t + 1 from 0..t, as transformers shifts the labels),
// so attention, positions and the loss see exactly what a Hugging Face
// model given that example alone sees. Padding comes after the example
// (causal attention never reads it) with kIgnoreTarget targets.
//
// val_size of the examples, chosen by the seed, are held out (LLaMA-
// Factory's val_size); the rest are visited in an order reshuffled every
// epoch from the seed (shuffle), as Hugging Face's trainer does.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace {

using namespace ztrain;

constexpr std::int32_t kPadInput = 0;  // any id: nothing reads a padded input

class Sft final : public DataSource {
 public:
  explicit Sft(const Options& o) : options_(o) {
    request_.dataset_dir = o.get_string("dataset_dir");
    request_.datasets = o.get_names("dataset");
    request_.chat_template = o.get_string("template");
    request_.train_on_prompt = o.get_bool("train_on_prompt");
    request_.mask_history = o.get_bool("mask_history");
    cutoff_len_ = static_cast<std::size_t>(o.get_int("cutoff_len"));
    val_size_ = o.get_number("val_size");
    shuffle_ = o.get_bool("shuffle");
  }

  static void declare_options(OptionList& o) {
    o.string("dataset_dir", "", "the directory of LLaMA-Factory's dataset_info.json")
        .must_be_given();
    o.names("dataset", "datasets of dataset_info.json, concatenated in order").must_be_given();
    o.string("template", "auto",
             "the chat template: \"auto\" (the model directory's own) or a .jinja file");
    o.integer("cutoff_len", 0,
              "tokens an example keeps at most (LLaMA-Factory's cutoff_len); 0: what a row "
              "holds, seq_len + 1")
        .at_least(0)
        .as_int();
    o.flag("train_on_prompt", false, "train on the prompts' tokens too");
    o.flag("mask_history", false, "train on each example's last answer only");
    o.flag("packing", false, "pack several examples into a row (not built yet)");
    o.number("val_size", 0.0, "share of the examples held out for evaluation")
        .at_least(0.0)
        .at_most(0.5);
    o.flag("shuffle", true, "visit the examples in a seeded order that changes every epoch");
  }

  void setup(const DataSetup& s) override {
    T_ = static_cast<std::size_t>(s.seq_len);
    seed_ = s.seed;
    check_options(s);
    request_.model_dir = s.model_dir;
    request_.cutoff_len = cutoff_len_ ? cutoff_len_ : T_ + 1;
    examples_ = s.sft->read(request_);
    if (examples_.count() == 0)
      throw DataError("[data] dataset: no example of " + std::to_string(examples_.bad_rows) +
                      " rows is left to train on" + first_bad() +
                      "; fix the rows (`ztrain sft-check` names them)");
    check_ids(s.vocab_size);
    split(s.evaluates);
  }

  DataInfo info() const override {
    DataInfo d;
    d.description = description();
    d.vocab_used = vocab_used_;
    d.files = examples_.files;
    d.train_sequences = train_.size();
    if (!val_.empty()) d.val_sequences = val_.size();
    d.tokenizer = examples_.tokenizer;
    d.tokenizer_identity = examples_.tokenizer_identity;
    d.masks = true;
    d.chat_template = examples_.chat_template_file;
    if (examples_.bad_rows) {
      d.notes.push_back("data: " + std::to_string(examples_.bad_rows) +
                        " bad rows are not trained on:");
      for (const std::string& b : examples_.bad) d.notes.push_back("  " + b);
      if (examples_.bad_rows > examples_.bad.size())
        d.notes.push_back("  ... and " + std::to_string(examples_.bad_rows - examples_.bad.size()) +
                          " more (`ztrain sft-check` counts them)");
    }
    return d;
  }

  // inputs, targets: (T); example e's tokens 0..L-2 and labels 1..L-1,
  // then padding.
  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    const std::size_t e = example_at(split, index);
    const std::size_t begin = examples_.starts[e], n = examples_.length(e) - 1;
    std::copy_n(examples_.input_ids.begin() + static_cast<std::ptrdiff_t>(begin), n, inputs);
    std::copy_n(examples_.labels.begin() + static_cast<std::ptrdiff_t>(begin + 1), n, targets);
    std::fill(inputs + n, inputs + T_, kPadInput);
    std::fill(targets + n, targets + T_, kIgnoreTarget);
  }

 private:
  void check_options(const DataSetup& s) const {
    if (options_.get_bool("packing"))
      throw ConfigError(options_.where("packing") +
                        ": [data] packing is not built yet (attention does not take example "
                        "boundaries); leave packing = false: each example gets a row of its own");
    if (cutoff_len_ > T_ + 1)
      throw ConfigError(options_.where("cutoff_len") + ": [data] cutoff_len " +
                        std::to_string(cutoff_len_) + " needs rows of cutoff_len - 1 = " +
                        std::to_string(cutoff_len_ - 1) + " positions, and [model] seq_len is " +
                        std::to_string(T_) + "; raise seq_len or lower cutoff_len");
    if (request_.chat_template != "auto" && !request_.chat_template.ends_with(".jinja"))
      throw ConfigError(options_.where("template") + ": [data] template \"" +
                        request_.chat_template +
                        "\": LLaMA-Factory's named templates are not built; use \"auto\" (the "
                        "model directory's chat_template) or a .jinja file");
    if (s.model_dir.empty())
      throw ConfigError(options_.where("dataset") +
                        ": the sft source renders and tokenizes with a model directory's "
                        "tokenizer and chat template, and the run has none; set [model] "
                        "init_from = \"DIR\" (a Hugging Face model directory)");
    if (s.evaluates && val_size_ == 0)
      throw ConfigError(options_.where("val_size") +
                        ": [data] val_size = 0 holds no example out, and the run evaluates; set "
                        "val_size (e.g. 0.1) or [train] eval_every = 0");
  }

  void check_ids(int vocab_size) {
    const auto top = std::max_element(examples_.input_ids.begin(), examples_.input_ids.end());
    vocab_used_ = top == examples_.input_ids.end() ? 0 : *top + 1;
    if (vocab_used_ > vocab_size)
      throw DataError(examples_.tokenizer + " gives token id " + std::to_string(vocab_used_ - 1) +
                      ", and [model] vocab_size is " + std::to_string(vocab_size) +
                      ": the model cannot embed it; use the model this tokenizer belongs to");
  }

  // val_size of the examples, chosen by the seed, held out; the rest
  // train, in file order before the epochs' shuffles.
  void split(bool evaluates) {
    const std::size_t n = examples_.count();
    const auto held = static_cast<std::size_t>(std::ceil(val_size_ * static_cast<double>(n)));
    if (held == n || (evaluates && held == 0))
      throw DataError(options_.where("val_size") + ": [data] val_size " +
                      std::to_string(val_size_) + " of " + std::to_string(n) +
                      " examples holds out " + std::to_string(held) +
                      "; at least one must train and, as the run evaluates, one be held out");
    std::vector<bool> is_val(n, false);
    const Permutation pick(n, hash_combine(seed_, 3));
    for (std::size_t i = 0; i < held; ++i) is_val[pick(i)] = true;
    for (std::size_t i = 0; i < n; ++i) (is_val[i] ? val_ : train_).push_back(i);
  }

  std::size_t example_at(Split split, std::uint64_t index) const {
    if (split == Split::val) return val_[index % val_.size()];
    const std::uint64_t n = train_.size(), epoch = index / n, at = index % n;
    return train_[shuffle_ ? Permutation(n, hash_combine(seed_, 4 + epoch))(at) : at];
  }

  std::string first_bad() const {
    return examples_.bad.empty() ? std::string() : " (the first: " + examples_.bad.front() + ")";
  }

  std::string description() const {
    std::size_t trained = 0;
    for (std::size_t e = 0; e < examples_.count(); ++e)
      trained += static_cast<std::size_t>(std::count_if(
          examples_.labels.begin() + static_cast<std::ptrdiff_t>(examples_.starts[e] + 1),
          examples_.labels.begin() + static_cast<std::ptrdiff_t>(examples_.starts[e + 1]),
          [](std::int32_t l) { return l != kIgnoreTarget; }));
    std::string names;
    for (const std::string& d : request_.datasets) names += (names.empty() ? "" : ", ") + d;
    return "sft " + names + ": " + std::to_string(examples_.count()) + " examples (" +
           std::to_string(val_.size()) + " held out), " +
           std::to_string(examples_.input_ids.size()) + " tokens, " + std::to_string(trained) +
           " trained; one example a row; template " + examples_.chat_template;
  }

  Options options_;
  SftRequest request_;
  std::size_t cutoff_len_ = 0, T_ = 0;
  double val_size_ = 0;
  bool shuffle_ = true;
  std::uint64_t seed_ = 0;
  SftExamples examples_;
  int vocab_used_ = 0;
  std::vector<std::size_t> train_, val_;
};

}  // namespace

ZTRAIN_PLUGIN("data", "sft", "0.1.0",
              "supervised fine-tuning on LLaMA-Factory datasets through a chat template", Sft)
