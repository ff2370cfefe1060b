// Fine-tuning examples as token ids and labels: every example of
// tests/data/llamafactory under two chat templates with marked answers,
// at six cutoff_len / train_on_prompt / mask_history settings, must give
// the ids and labels that transformers (the render and its answer spans),
// tokenizers (each piece) and LLaMA-Factory's own supervised
// preprocessing (truncation and labels) give together
// (encoding_golden.json, tools/make_sft_encoding_golden.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/sft_encoding.h"
#include "ztrain/kernels.h"

namespace {

using namespace ztrain;

const std::filesystem::path kData = std::filesystem::path(ZTRAIN_TEST_SOURCE_DIR) / "tests/data";

nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("examples encode as transformers, tokenizers and LLaMA-Factory encode them together") {
  const auto tokenizer = text::load_tokenizer(kData / "tokenizers/byte_level.json");
  const nlohmann::json aligned = read_json(kData / "llamafactory/golden.json");
  // The k-th example ztrain reads of a dataset is its k-th row LLaMA-Factory
  // keeps with an answer to train on.
  std::map<std::pair<std::string, std::size_t>, text::SftExample> examples;
  for (const auto& [name, rows] : aligned.items()) {
    const text::SftDataset d = text::read_sft_datasets(kData / "llamafactory", {name});
    std::size_t k = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      if (r.is_null()) continue;
      const std::string answer = r.at("turns").back().at("content");
      if (answer.find_first_not_of(" \t\r\n") == std::string::npos) continue;
      examples[{name, i}] = d.examples.at(k++);
    }
  }
  std::size_t checked = 0, truncated = 0;
  const nlohmann::json golden = read_json(kData / "llamafactory/encoding_golden.json");
  for (const auto& c : golden.at("cases")) {
    text::ChatTemplateSource source{
        read(kData / "chat_templates" / c.at("template").get<std::string>()),
        c.at("template"),
        {},
        {}};
    for (const auto& [k, v] : c.at("special_tokens").items()) source.special_tokens[k] = v;
    const text::ChatTemplate chat(std::move(source));
    const text::SftEncoding o{c.at("cutoff_len"), c.at("train_on_prompt"), c.at("mask_history")};
    CAPTURE(c.at("template").get<std::string>());
    CAPTURE(c.at("dataset").get<std::string>());
    CAPTURE(c.at("index").get<std::size_t>());
    CAPTURE(o.cutoff_len);
    CAPTURE(o.train_on_prompt);
    CAPTURE(o.mask_history);
    const text::EncodedExample e =
        text::encode_example(chat, *tokenizer, examples.at({c.at("dataset"), c.at("index")}), o);
    CHECK(e.input_ids == c.at("input_ids").get<std::vector<std::int32_t>>());
    CHECK(e.labels == c.at("labels").get<std::vector<std::int32_t>>());
    truncated += e.input_ids.size() == o.cutoff_len;
    ++checked;
  }
  CHECK(checked == 168);
  CHECK(truncated > 20);  // the cutoffs bite
}

// infer_seqlen's three cases, and Python's int() of the share.
TEST_CASE("truncation keeps LLaMA-Factory's lengths") {
  CHECK(text::truncated_lengths(100, 10, 40) == std::pair<std::size_t, std::size_t>{30, 10});
  CHECK(text::truncated_lengths(10, 100, 40) == std::pair<std::size_t, std::size_t>{10, 30});
  CHECK(text::truncated_lengths(30, 30, 40) == std::pair<std::size_t, std::size_t>{20, 20});
  CHECK(text::truncated_lengths(31, 29, 40) == std::pair<std::size_t, std::size_t>{21, 19});
  CHECK(text::truncated_lengths(5, 5, 0) == std::pair<std::size_t, std::size_t>{0, 0});
}
