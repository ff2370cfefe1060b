#include "commands/sft_check.h"

#include <algorithm>
#include <cstdint>

#include "text/sft_reader.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain {
namespace {

// Example i's text, its trained runs of tokens in [[ ]].
std::string marked_text(const SftExamples& e, std::size_t i, const text::Tokenizer& tokenizer) {
  std::string out;
  std::size_t at = e.starts[i];
  while (at < e.starts[i + 1]) {
    const bool trained = e.labels[at] != kIgnoreTarget;
    std::size_t end = at;
    while (end < e.starts[i + 1] && (e.labels[end] != kIgnoreTarget) == trained) ++end;
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

void sft_check(const SftRequest& r, std::ostream& out) {
  if (r.datasets.empty())
    throw ConfigError("--dataset: name one or more datasets of dataset_info.json");
  const SftExamples e = text::read_sft_examples(r);
  out << "sft-check: " << e.count() << " examples read, " << e.bad_rows
      << " bad rows (not trained on)\n";
  for (const std::string& bad : e.bad) out << "  " << bad << "\n";
  if (e.bad_rows > e.bad.size()) out << "  ... and " << e.bad_rows - e.bad.size() << " more\n";
  if (e.count() == 0)
    throw DataError("no example of " + std::to_string(e.bad_rows) +
                    " rows is left to train on; fix the rows named above");
  const std::size_t trained = static_cast<std::size_t>(
      std::count_if(e.labels.begin(), e.labels.end(), [](auto l) { return l != kIgnoreTarget; }));
  std::size_t longest = 0, truncated = 0;
  for (std::size_t i = 0; i < e.count(); ++i) {
    longest = std::max(longest, e.length(i));
    truncated += e.length(i) >= r.cutoff_len;
  }
  out << "tokens (cutoff_len " << r.cutoff_len << (r.train_on_prompt ? ", train_on_prompt" : "")
      << (r.mask_history ? ", mask_history" : "") << "): " << e.input_ids.size() << " in all, "
      << trained << " trained (" << percent(trained, e.input_ids.size()) << "), longest example "
      << longest << ", " << truncated << " cut at cutoff_len\n"
      << "chat template: " << e.chat_template << "\nfirst example: " << e.where.front()
      << ", trained text in [[ ]]:\n"
      << marked_text(e, 0, *text::load_tokenizer(e.tokenizer)) << "\n";
}

}  // namespace ztrain
