#include "commands/prepare_tokenized.h"

#include <algorithm>
#include <filesystem>

#include "text/sft_reader.h"
#include "train/tokenized_examples.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"

namespace ztrain {

void prepare_tokenized(const SftRequest& r, std::ostream& out) {
  if (r.datasets.empty())
    throw ConfigError("--dataset: name one or more datasets of dataset_info.json");
  const bool there =
      std::filesystem::exists(std::filesystem::path(r.tokenized_path) / "tokenized.json");
  const SftExamples e = TokenizedReader(text::host_sft_reader()).read(r);
  if (e.count() == 0)
    throw DataError("no example of " + std::to_string(e.bad_rows) +
                    " rows is left to train on; `ztrain sft-check` names the bad rows");
  const auto trained =
      std::count_if(e.labels.begin(), e.labels.end(), [](auto l) { return l != kIgnoreTarget; });
  out << "prepare: " << e.count() << " examples (" << e.bad_rows << " bad rows), "
      << e.input_ids.size() << " tokens, " << trained << " trained, template " << e.chat_template
      << (there ? ": " + r.tokenized_path + " holds them already\n"
                : ", saved in " + r.tokenized_path + "\n")
      << "[data]\nplugin = \"sft\"\ntokenized_path = \"" << r.tokenized_path
      << "\"  # with the same dataset, template and cutoff keys\n";
}

}  // namespace ztrain
