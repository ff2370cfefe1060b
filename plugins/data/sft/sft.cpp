// sft: supervised fine-tuning on LLaMA-Factory's datasets (stage pt: its
// continued pretraining on documents, every token but the pad trained,
// packed into blocks by the host's reader as LLaMA-Factory packs them,
// one block a row with attention across its documents). The host's
// reader (ztrain/sft_examples.h) gives each example's token ids and
// labels, rendered by the model directory's chat template, cut and masked
// with LLaMA-Factory's cutoff_len, train_on_prompt and mask_history; this
// source only lays them out in rows of seq_len T.
//
// An example of L tokens takes L - 1 places of a row: its first L - 1
// tokens are the inputs and labels 1..L-1 the targets (the model
// predicting token t + 1 from 0..t, as transformers shifts the labels).
// Unpacked, each example has a row of its own from its start, padded
// after it (causal attention never reads padding) with kIgnoreTarget
// targets, so attention, positions and the loss see exactly what a
// Hugging Face model given that example alone sees. Packed, examples
// share rows, placed best-fit decreasing (longest first, each into the
// fullest row it fits, a new row when none has room), and the source
// declares segments: each token's position in its example restarts at 0,
// and attention never crosses from one example into another, so each
// example still sees itself alone, with far fewer padded places.
//
// val_size of the examples, chosen by the seed, are held out (LLaMA-
// Factory's val_size); the training rows are visited in an order
// reshuffled every epoch from the seed (shuffle), as Hugging Face's
// trainer does.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace {

using namespace ztrain;

constexpr std::int32_t kPadInput = 0;  // any id: nothing reads a padded input

// Rows of examples: row r holds examples[starts[r] .. starts[r + 1]), in
// that order.
struct Rows {
  std::vector<std::size_t> starts{0}, examples;
  std::size_t count() const { return starts.size() - 1; }
  void add(const std::vector<std::size_t>& row) {
    examples.insert(examples.end(), row.begin(), row.end());
    starts.push_back(examples.size());
  }
};

// Best-fit decreasing: the examples `ids` of places[i] places each
// (<= capacity), longest first (ties by id), each into the row with the
// least room left that holds it, else a new row; rows in the order opened.
Rows best_fit_decreasing(std::vector<std::size_t> ids, const std::vector<std::size_t>& places,
                         std::size_t capacity) {
  std::stable_sort(ids.begin(), ids.end(),
                   [&](std::size_t a, std::size_t b) { return places[a] > places[b]; });
  std::vector<std::vector<std::size_t>> rows;
  std::set<std::pair<std::size_t, std::size_t>> room;  // (places left, row)
  for (std::size_t id : ids) {
    auto fit = room.lower_bound({places[id], 0});
    std::size_t row = rows.size(), left = capacity;
    if (fit != room.end()) {
      std::tie(left, row) = *fit;
      room.erase(fit);
    } else {
      rows.emplace_back();
    }
    rows[row].push_back(id);
    room.insert({left - places[id], row});
  }
  Rows out;
  for (const auto& r : rows) out.add(r);
  return out;
}

class Sft final : public DataSource {
 public:
  explicit Sft(const Options& o) : options_(o) {
    request_.dataset_dir = o.get_string("dataset_dir");
    request_.datasets = o.get_names("dataset");
    request_.chat_template = o.get_string("template");
    request_.template_where = o.where("template");
    request_.enable_thinking = o.get_bool("enable_thinking");
    request_.tokenized_path = o.get_string("tokenized_path");
    if (o.has_value("default_system")) request_.default_system = o.get_string("default_system");
    request_.train_on_prompt = o.get_bool("train_on_prompt");
    request_.mask_history = o.get_bool("mask_history");
    cutoff_len_ = static_cast<std::size_t>(o.get_int("cutoff_len"));
    request_.max_samples = static_cast<std::size_t>(o.get_int("max_samples"));
    // pt: LLaMA-Factory's packing (documents concatenated into blocks,
    // its default), done by the reader; each block then has a row.
    request_.pretrain.on = o.get_string("stage") == "pt";
    request_.pretrain.packing = o.given("packing") ? o.get_bool("packing") : true;
    request_.pretrain.workers = static_cast<std::size_t>(o.get_int("preprocessing_num_workers"));
    request_.pretrain.batch = static_cast<std::size_t>(o.get_int("preprocessing_batch_size"));
    packing_ = !request_.pretrain.on && o.get_bool("packing");
    val_size_ = o.get_number("val_size");
    shuffle_ = o.get_bool("shuffle");
    if (o.has_value("eval_dataset")) eval_datasets_ = o.get_names("eval_dataset");
    if (!eval_datasets_.empty() && val_size_ > 0)
      throw ConfigError(o.where("val_size") +
                        ": [data] val_size and eval_dataset both hold examples out; give one "
                        "(LLaMA-Factory refuses both too)");
  }

  static void declare_options(OptionList& o) {
    o.string("dataset_dir", "", "the directory of LLaMA-Factory's dataset_info.json")
        .must_be_given();
    o.names("dataset", "datasets of dataset_info.json, concatenated in order").must_be_given();
    o.names("eval_dataset",
            "datasets of dataset_info.json evaluated on instead of a val_size share of dataset "
            "(LLaMA-Factory's eval_dataset)");
    o.string("template", "auto",
             "the chat template: \"auto\" (the model directory's own), a .jinja file, or a "
             "LLaMA-Factory template's name (llama3, qwen, qwen3, qwen3_nothink)");
    o.flag("enable_thinking", true,
           "LLaMA-Factory's reasoning templates (qwen3): an answer without a thought is trained "
           "with an empty one; false: thoughts removed, the empty one ends the prompt");
    o.integer("cutoff_len", 0,
              "tokens an example keeps at most (LLaMA-Factory's cutoff_len); 0: what a row "
              "holds, seq_len + 1")
        .at_least(0)
        .as_int();
    o.integer("max_samples", 0,
              "each dataset's first rows taken (LLaMA-Factory's max_samples); 0: all")
        .at_least(0);
    o.flag("train_on_prompt", false, "train on the prompts' tokens too");
    o.flag("mask_history", false, "train on each example's last answer only");
    o.optional_string("default_system",
                      "a LLaMA-Factory template's default system message, replaced (its "
                      "default_system)");
    o.string("tokenized_path", "",
             "a directory for the encoded examples (LLaMA-Factory's tokenized_path): saved there "
             "when it does not exist, loaded from it when it holds the same keys' examples");
    o.string("stage", "sft",
             "LLaMA-Factory's stage: sft (conversations, the answers trained) or pt (documents, "
             "every token trained)")
        .one_of({"sft", "pt"});
    o.flag("packing", false,
           "sft: pack several examples into a row (attention never crosses between them); false: "
           "one example a row. pt: documents concatenated into blocks of cutoff_len (absent: "
           "true, LLaMA-Factory's default); false: one document a row");
    o.integer("preprocessing_num_workers", 1,
              "pt packing: the contiguous shards LLaMA-Factory's preprocessing cuts the rows into "
              "(its preprocessing_num_workers), each packed on its own")
        .at_least(1);
    o.integer("preprocessing_batch_size", 1000,
              "pt packing: rows packed together, each batch's remainder dropped (LLaMA-Factory's "
              "preprocessing_batch_size)")
        .at_least(1);
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
    request_.seed = s.seed;
    request_.cutoff_len = cutoff_len_ ? cutoff_len_ : T_ + 1;
    examples_ = s.sft->read(request_);
    if (examples_.count() == 0)
      throw DataError("[data] dataset: no example of " + std::to_string(examples_.bad_rows) +
                      " rows is left to train on" + first_bad() +
                      "; fix the rows (`ztrain sft-check` names them)");
    trained_examples_ = examples_.count();
    if (!eval_datasets_.empty()) read_eval(*s.sft);
    check_ids(s.vocab_size);
    split(s.evaluates);
    description_ = description();
  }

  DataInfo info() const override {
    DataInfo d;
    d.description = description_;
    d.vocab_used = vocab_used_;
    d.files = examples_.files;
    d.train_sequences = train_.count();
    if (val_.count()) d.val_sequences = val_.count();
    d.tokenizer = examples_.tokenizer;
    d.tokenizer_identity = examples_.tokenizer_identity;
    d.masks = true;
    d.segments = packing_;
    d.chat_template = examples_.chat_template_file;
    d.chat_template_text = examples_.chat_template_text;
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

  // inputs, targets: (T); each example of the row in turn, its tokens
  // 0..L-2 and labels 1..L-1, then padding.
  void fill(Split split, std::uint64_t index, std::int32_t* inputs,
            std::int32_t* targets) const override {
    std::size_t at = 0;
    for_each_example(split, index, [&](std::size_t e) {
      const std::size_t begin = examples_.starts[e], n = examples_.length(e) - 1;
      std::copy_n(examples_.input_ids.begin() + static_cast<std::ptrdiff_t>(begin), n, inputs + at);
      std::copy_n(examples_.labels.begin() + static_cast<std::ptrdiff_t>(begin + 1), n,
                  targets + at);
      at += n;
    });
    std::fill(inputs + at, inputs + T_, kPadInput);
    std::fill(targets + at, targets + T_, kIgnoreTarget);
  }

  // positions: (T); 0..L-2 for each example of the row, then the padding
  // as one more run from 0.
  void fill_positions(Split split, std::uint64_t index, std::int32_t* positions) const override {
    std::size_t at = 0;
    for_each_example(split, index, [&](std::size_t e) {
      const std::size_t n = examples_.length(e) - 1;
      std::iota(positions + at, positions + at + n, 0);
      at += n;
    });
    std::iota(positions + at, positions + T_, 0);
  }

 private:
  void check_options(const DataSetup& s) const {
    if (!s.sft)
      throw InternalError("the sft source was set up without the host's reader (DataSetup::sft)");
    if (cutoff_len_ > T_ + 1)
      throw ConfigError(options_.where("cutoff_len") + ": [data] cutoff_len " +
                        std::to_string(cutoff_len_) + " needs rows of cutoff_len - 1 = " +
                        std::to_string(cutoff_len_ - 1) + " positions, and [model] seq_len is " +
                        std::to_string(T_) + "; raise seq_len or lower cutoff_len");
    if (s.model_dir.empty())
      throw ConfigError(options_.where("dataset") +
                        ": the sft source renders and tokenizes with a model directory's "
                        "tokenizer and chat template, and the run has none; set [model] "
                        "init_from = \"DIR\" (a Hugging Face model directory)");
    if (s.evaluates && val_size_ == 0 && eval_datasets_.empty())
      throw ConfigError(options_.where("val_size") +
                        ": [data] val_size = 0 holds no example out, and the run evaluates; set "
                        "val_size (e.g. 0.1), eval_dataset, or [train] eval_every = 0");
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
  // train, in file order before the epochs' shuffles; each split's rows.
  // eval_dataset's examples, read as the training's are (their own
  // tokenized_path under it), after them: every one held out.
  void read_eval(const SftReader& reader) {
    SftRequest r = request_;
    r.datasets = eval_datasets_;
    if (!r.tokenized_path.empty()) r.tokenized_path += "/eval";
    const SftExamples e = reader.read(r);
    if (e.count() == 0)
      throw DataError(options_.where("eval_dataset") + ": [data] eval_dataset: no example of " +
                      std::to_string(e.bad_rows) + " rows is left to evaluate on" +
                      (e.bad.empty() ? "" : " (the first: " + e.bad.front() + ")"));
    const std::size_t base = examples_.input_ids.size();
    examples_.input_ids.insert(examples_.input_ids.end(), e.input_ids.begin(), e.input_ids.end());
    examples_.labels.insert(examples_.labels.end(), e.labels.begin(), e.labels.end());
    for (std::size_t i = 1; i < e.starts.size(); ++i)
      examples_.starts.push_back(base + e.starts[i]);
    examples_.where.insert(examples_.where.end(), e.where.begin(), e.where.end());
    examples_.bad_rows += e.bad_rows;
    examples_.bad.insert(examples_.bad.end(), e.bad.begin(), e.bad.end());
    examples_.files.insert(examples_.files.end(), e.files.begin(), e.files.end());
  }

  void split(bool evaluates) {
    const std::size_t n = examples_.count();
    if (trained_examples_ < n) {  // eval_dataset: the examples after the training's
      std::vector<std::size_t> train(trained_examples_), val(n - trained_examples_);
      std::iota(train.begin(), train.end(), 0);
      std::iota(val.begin(), val.end(), trained_examples_);
      train_ = rows_of(train);
      val_ = rows_of(val);
      return;
    }
    const auto held = static_cast<std::size_t>(std::ceil(val_size_ * static_cast<double>(n)));
    if (held == n || (evaluates && held == 0))
      throw DataError(options_.where("val_size") + ": [data] val_size " +
                      std::to_string(val_size_) + " of " + std::to_string(n) +
                      " examples holds out " + std::to_string(held) +
                      "; at least one must train and, as the run evaluates, one be held out");
    std::vector<bool> is_val(n, false);
    const Permutation pick(n, hash_combine(seed_, 3));
    for (std::size_t i = 0; i < held; ++i) is_val[pick(i)] = true;
    std::vector<std::size_t> train, val;
    for (std::size_t i = 0; i < n; ++i) (is_val[i] ? val : train).push_back(i);
    train_ = rows_of(train);
    val_ = rows_of(val);
  }

  Rows rows_of(const std::vector<std::size_t>& ids) const {
    if (packing_) {
      std::vector<std::size_t> places(examples_.count());
      for (std::size_t e = 0; e < places.size(); ++e) places[e] = examples_.length(e) - 1;
      return best_fit_decreasing(ids, places, T_);
    }
    Rows rows;
    for (std::size_t id : ids) rows.add({id});
    return rows;
  }

  // f(example) for each example of row `index` of the split, in order.
  template <class F>
  void for_each_example(Split split, std::uint64_t index, F&& f) const {
    const Rows& rows = split == Split::val ? val_ : train_;
    const std::uint64_t n = rows.count(), epoch = index / n, at = index % n;
    const std::uint64_t r =
        split == Split::train && shuffle_ ? Permutation(n, hash_combine(seed_, 4 + epoch))(at) : at;
    for (std::size_t i = rows.starts[r]; i < rows.starts[r + 1]; ++i) f(rows.examples[i]);
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
    for (std::size_t i = 0; i < eval_datasets_.size(); ++i)
      names += (i ? ", " : "; evaluated on ") + eval_datasets_[i];
    const std::size_t held = val_.examples.size();
    const std::string layout =
        packing_ ? "packed into " + std::to_string(train_.count()) + " rows" +
                       (held ? " (and " + std::to_string(val_.count()) + " held out)" : "")
                 : "one example a row";
    if (request_.pretrain.on)
      return "pt " + names + ": " + std::to_string(examples_.count()) +
             (request_.pretrain.packing
                  ? " blocks of " + std::to_string(request_.cutoff_len) + " tokens"
                  : " documents") +
             " (" + std::to_string(held) + " held out), " +
             std::to_string(examples_.input_ids.size()) + " tokens, " + std::to_string(trained) +
             " trained; one a row";
    return "sft " + names + ": " + std::to_string(examples_.count()) + " examples (" +
           std::to_string(held) + " held out), " + std::to_string(examples_.input_ids.size()) +
           " tokens, " + std::to_string(trained) + " trained; " + layout + "; template " +
           examples_.chat_template;
  }

  Options options_;
  SftRequest request_;
  std::size_t cutoff_len_ = 0, T_ = 0;
  double val_size_ = 0;
  bool shuffle_ = true, packing_ = false;
  std::vector<std::string> eval_datasets_;
  std::size_t trained_examples_ = 0;  // the training's; eval_dataset's come after
  std::uint64_t seed_ = 0;
  SftExamples examples_;
  std::string description_;  // counted once, at setup
  int vocab_used_ = 0;
  Rows train_, val_;
};

}  // namespace

ZTRAIN_PLUGIN("data", "sft", "0.1.0",
              "supervised fine-tuning on LLaMA-Factory datasets through a chat template", Sft)
