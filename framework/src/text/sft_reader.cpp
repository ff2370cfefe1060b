#include "text/sft_reader.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <map>
#include <optional>

#include "text/pretrain_encoding.h"
#include "text/sft_encoding.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain::text {
namespace {

// One row's outcome: its example, or why it is a bad row (a DataError),
// or the template's failure on it (a ConfigError, which stops the read).
struct Outcome {
  std::optional<EncodedExample> example;
  std::string bad;
  std::string config_error;
};

// Whether a model predicting labels[t + 1] from tokens 0..t has anything
// to learn: labels[0] is never a target.
bool trains_something(const EncodedExample& e) {
  return std::any_of(e.labels.begin() + (e.labels.empty() ? 0 : 1), e.labels.end(),
                     [](std::int32_t l) { return l != kIgnoreTarget; });
}

// The request's template: one of LLaMA-Factory's by name, else a Jinja
// template (the model directory's own, or a .jinja file).
class Template {
 public:
  Template(const SftRequest& r, const Tokenizer& tokenizer, const std::filesystem::path& file)
      : tokenizer_(tokenizer) {
    const std::string at = r.template_where.empty() ? "" : r.template_where + ": ";
    if (r.pretrain.on && r.chat_template.ends_with(".jinja"))
      throw ConfigError(at + "[data] template " + r.chat_template +
                        ": the pt stage renders no conversation; leave template \"auto\" (the "
                        "tokenizer's EOS ends each document) or name a LLaMA-Factory template "
                        "(its EOS does)");
    if (r.default_system && (r.chat_template == "auto" || r.chat_template.ends_with(".jinja")))
      throw ConfigError(at +
                        "[data] default_system replaces a LLaMA-Factory template's default "
                        "system message; with template \"" +
                        r.chat_template +
                        "\" the Jinja template decides it: give the system message in the data, "
                        "or name a LLaMA-Factory template");
    if (r.pretrain.on && r.chat_template == "auto") return;  // documents need no template
    if (r.chat_template == "auto" || r.chat_template.ends_with(".jinja")) {
      std::map<std::string, std::string> variables;
      if (!r.enable_thinking) variables["enable_thinking"] = "false";
      jinja_.emplace(ChatTemplate::from_model_dir(r.model_dir,
                                                  r.chat_template == "auto"
                                                      ? std::filesystem::path()
                                                      : std::filesystem::path(r.chat_template),
                                                  std::move(variables)));
      return;
    }
    named_ = LlamaFactoryTemplate::find(r.chat_template, tokenizer, config_token(file, "bos_token"),
                                        {r.enable_thinking, r.default_system});
    if (!named_)
      throw ConfigError(at + "[data] template \"" + r.chat_template +
                        "\" is not one of LLaMA-Factory's templates ztrain builds (" +
                        LlamaFactoryTemplate::names() +
                        ", each held to LLaMA-Factory's own ids); use one of those, \"auto\" (the "
                        "model directory's chat_template) or a .jinja file");
  }
  EncodedExample encode(const SftExample& example, const SftEncoding& o) const {
    return named_ ? encode_example(*named_, example, o)
                  : encode_example(*jinja_, tokenizer_, example, o);
  }
  std::string where() const {
    return named_ ? named_->where() : jinja_ ? jinja_->where() : "none (documents)";
  }
  const LlamaFactoryTemplate* named() const { return named_ ? &*named_ : nullptr; }
  std::string file() const { return jinja_ ? jinja_->file().string() : std::string(); }

 private:
  const Tokenizer& tokenizer_;
  std::optional<ChatTemplate> jinja_;
  std::optional<LlamaFactoryTemplate> named_;
};

// A row's problem, led by its file:line once.
std::string at_row(const SftExample& example, const std::string& what) {
  return what.rfind(example.where, 0) == 0 ? what : example.where + ": " + what;
}

Outcome encode(const Template& chat, const SftExample& example, const SftEncoding& o) {
  Outcome out;
  try {
    EncodedExample e = chat.encode(example, o);
    if (trains_something(e))
      out.example = std::move(e);
    else
      out.bad = example.where + ": nothing left to train on within cutoff_len " +
                std::to_string(o.cutoff_len) + " (the answer is cut away)";
  } catch (const ConfigError& err) {
    out.config_error = at_row(example, err.what());
  } catch (const DataError& err) {
    out.bad = at_row(example, err.what());
  }
  return out;
}

class HostSftReader final : public SftReader {
 public:
  SftExamples read(const SftRequest& request) const override { return read_sft_examples(request); }
};

// The EOS, BOS and pad of the pt stage, as LLaMA-Factory fixes them: the
// tokenizer's EOS, replaced by a named template's stop word; the text
// appended to a document is that EOS, but <|end_of_text|> for llama3 (its
// processor's own rule); the pad is the tokenizer's, else that EOS; BOS
// only where tokenizer_config.json sets add_bos_token.
PretrainTokens pretrain_tokens(const Template& chat, const Tokenizer& tokenizer,
                               const std::filesystem::path& file) {
  const auto named = chat.named();
  const std::optional<std::string> eos = named ? named->eos() : config_token(file, "eos_token");
  const std::optional<std::string> pad = config_token(file, "pad_token");
  const std::optional<std::string> bos = config_token(file, "bos_token");
  const bool add_bos = config_flag(file, "add_bos_token");
  if (!eos)
    throw ConfigError(file.parent_path().string() +
                      "/tokenizer_config.json names no eos_token, which the pt stage ends each "
                      "document with; give the model directory's own tokenizer_config.json");
  for (const auto* token : {&*eos, pad ? &*pad : &*eos, add_bos && bos ? &*bos : &*eos})
    if (!tokenizer.token_id(*token))
      throw ConfigError("the tokenizer has no token " + *token +
                        ", which the pt stage needs (tokenizer_config.json or the template names "
                        "it); give the model directory's own tokenizer");
  PretrainTokens t;
  t.eos = named && named->name() == "llama3" ? "<|end_of_text|>" : *eos;
  t.pad = tokenizer.token_id(pad ? *pad : *eos);
  if (add_bos && bos) t.bos = *bos;
  return t;
}

void add_example(SftExamples& out, const EncodedExample& e, const std::string& where) {
  out.input_ids.insert(out.input_ids.end(), e.input_ids.begin(), e.input_ids.end());
  out.labels.insert(out.labels.end(), e.labels.begin(), e.labels.end());
  out.starts.push_back(out.input_ids.size());
  out.where.push_back(where);
}

}  // namespace

SftExamples read_sft_examples(const SftRequest& r) {
  if (r.datasets.empty())
    throw ConfigError("no dataset named; name one or more of dataset_info.json");
  const std::filesystem::path tokenizer_file = tokenizer_in(r.model_dir);
  if (tokenizer_file.empty())
    throw ConfigError("no tokenizer.json or tokenizer.model in '" + r.model_dir +
                      "'; give the model directory the run fine-tunes");
  const auto tokenizer = load_tokenizer(tokenizer_file);
  const Template chat(r, *tokenizer, tokenizer_file);
  const SftDataset d =
      read_sft_datasets(r.dataset_dir, r.datasets, {r.max_samples, r.seed, r.pretrain.on});
  SftExamples out;
  out.bad_rows = d.bad_rows;
  out.bad = d.bad;
  out.files = d.files;
  out.files.push_back(tokenizer_file.string());
  if (r.chat_template.ends_with(".jinja")) out.files.push_back(r.chat_template);
  out.tokenizer = tokenizer_file.string();
  out.tokenizer_identity = tokenizer_identity(tokenizer_file);
  out.chat_template = chat.where();
  out.chat_template_file = chat.file();
  if (chat.named()) out.chat_template_text = chat.named()->jinja();
  if (r.pretrain.on) {
    const PretrainEncoding p{r.cutoff_len, r.pretrain.packing, r.pretrain.workers,
                             r.pretrain.batch};
    for (const PretrainBlock& b : pretrain_blocks(
             d.examples, *tokenizer, pretrain_tokens(chat, *tokenizer, tokenizer_file), p))
      add_example(out, b.example, b.where);
    return out;
  }
  const SftEncoding o{r.cutoff_len, r.train_on_prompt, r.mask_history};
  std::vector<Outcome> outcomes(d.examples.size());
  tbb::parallel_for(std::size_t{0}, d.examples.size(),
                    [&](std::size_t i) { outcomes[i] = encode(chat, d.examples[i], o); });
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    Outcome& e = outcomes[i];
    if (!e.config_error.empty()) throw ConfigError(e.config_error);
    if (!e.example) {
      ++out.bad_rows;
      if (out.bad.size() < kBadRowsKept) out.bad.push_back(e.bad);
      continue;
    }
    add_example(out, *e.example, d.examples[i].where);
  }
  return out;
}

const SftReader& host_sft_reader() {
  static const HostSftReader reader;
  return reader;
}

}  // namespace ztrain::text
