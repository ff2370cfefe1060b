#include "commands/sft_check.h"

#include <algorithm>
#include <cstdint>

#include "checkpoint/hf_export.h"
#include "text/sft_encoding.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain {
namespace {

// The example's text, its trained runs of tokens in [[ ]].
std::string marked_text(const text::EncodedExample& e, const text::Tokenizer& tokenizer) {
  std::string out;
  std::size_t at = 0;
  while (at < e.input_ids.size()) {
    const bool trained = e.labels[at] != kIgnoreTarget;
    std::size_t end = at;
    while (end < e.input_ids.size() && (e.labels[end] != kIgnoreTarget) == trained) ++end;
    const std::string piece =
        tokenizer.decode({e.input_ids.begin() + static_cast<std::ptrdiff_t>(at),
                          e.input_ids.begin() + static_cast<std::ptrdiff_t>(end)});
    out += trained ? "[[" + piece + "]]" : piece;
    at = end;
  }
  return out;
}

std::string percent(std::size_t part, std::size_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%",
                whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

}  // namespace

void sft_check(const SftCheckArgs& a, std::ostream& out) {
  if (a.datasets.empty())
    throw ConfigError("--dataset: name one or more datasets of dataset_info.json");
  const std::filesystem::path tokenizer_file = tokenizer_in(a.model_dir);
  if (tokenizer_file.empty())
    throw ConfigError("no tokenizer.json or tokenizer.model in '" + a.model_dir.string() +
                      "'; give the model directory the run fine-tunes");
  const auto tokenizer = text::load_tokenizer(tokenizer_file);
  const text::ChatTemplate chat = text::ChatTemplate::from_model_dir(a.model_dir);
  const text::SftDataset d = text::read_sft_datasets(a.dataset_dir, a.datasets);
  out << "sft-check: " << d.examples.size() << " examples read, " << d.bad_rows
      << " bad rows (not trained on)\n";
  for (const std::string& bad : d.bad) out << "  " << bad << "\n";
  if (d.bad_rows > d.bad.size()) out << "  ... and " << d.bad_rows - d.bad.size() << " more\n";
  if (d.examples.empty())
    throw DataError("no example of " + std::to_string(d.examples.size() + d.bad_rows) +
                    " rows is left to train on; fix the rows named above");
  const text::SftEncoding o{a.cutoff_len, a.train_on_prompt, a.mask_history};
  std::size_t tokens = 0, trained = 0, longest = 0, truncated = 0;
  std::string first;
  for (const text::SftExample& e : d.examples) {
    const text::EncodedExample enc = text::encode_example(chat, *tokenizer, e, o);
    tokens += enc.input_ids.size();
    trained += static_cast<std::size_t>(std::count_if(enc.labels.begin(), enc.labels.end(),
                                                      [](auto l) { return l != kIgnoreTarget; }));
    longest = std::max(longest, enc.input_ids.size());
    truncated += enc.input_ids.size() >= a.cutoff_len;
    if (first.empty())
      first = e.where + ", trained text in [[ ]]:\n" + marked_text(enc, *tokenizer);
  }
  out << "tokens (cutoff_len " << a.cutoff_len << (a.train_on_prompt ? ", train_on_prompt" : "")
      << (a.mask_history ? ", mask_history" : "") << "): " << tokens << " in all, " << trained
      << " trained (" << percent(trained, tokens) << "), longest example " << longest << ", "
      << truncated << " cut at cutoff_len\n"
      << "chat template: " << chat.where() << "\nfirst example: " << first << "\n";
}

}  // namespace ztrain
