// Fine-tuning examples as token ids and labels: every example of
// tests/data/llamafactory under two chat templates with marked answers,
// at six cutoff_len / train_on_prompt / mask_history settings, must give
// the ids and labels that transformers (the render and its answer spans),
// tokenizers (each piece) and LLaMA-Factory's own supervised
// preprocessing (truncation and labels) give together
// (encoding_golden.json, tools/make_sft_encoding_golden.py); and under
// LLaMA-Factory's own named templates, the ids its Template and
// supervised preprocessing give (template_golden.json,
// tools/make_llamafactory_template_golden.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/sft_encoding.h"
#include "ztrain/error.h"
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
  CHECK(checked == 180);  // the tool rows under Qwen2.5's template alone
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

namespace {

text::SftExample golden_example(const nlohmann::json& c) {
  text::SftExample e;
  e.system = c.at("system");
  e.tools = c.at("tools");
  for (const auto& t : c.at("turns")) e.turns.push_back({t.at("role"), t.at("content")});
  e.where = c.at("example");
  return e;
}

std::optional<std::string> golden_bos(const nlohmann::json& c) {
  const auto& tokens = c.at("special_tokens");
  if (!tokens.contains("bos_token")) return std::nullopt;
  return tokens.at("bos_token").get<std::string>();
}

}  // namespace

TEST_CASE("LLaMA-Factory's named templates encode as its own code encodes them") {
  const auto tokenizer = text::load_tokenizer(kData / "tokenizers/byte_level_chat.json");
  const nlohmann::json golden = read_json(kData / "llamafactory/template_golden.json");
  std::map<std::string, std::size_t> per_template;
  std::size_t truncated = 0, thought = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string name = c.at("template");
    text::LlamaFactoryTemplateOptions options{c.at("enable_thinking").get<bool>()};
    if (!c.at("default_system").is_null()) options.default_system = c.at("default_system");
    const auto chat = text::LlamaFactoryTemplate::find(name, *tokenizer, golden_bos(c), options);
    REQUIRE(chat);
    const text::SftEncoding o{c.at("cutoff_len"), c.at("train_on_prompt"), c.at("mask_history")};
    CAPTURE(name);
    CAPTURE(c.at("enable_thinking").get<bool>());
    CAPTURE(c.at("example").get<std::string>());
    CAPTURE(o.cutoff_len);
    CAPTURE(o.train_on_prompt);
    CAPTURE(o.mask_history);
    const text::EncodedExample e = text::encode_example(*chat, golden_example(c), o);
    CHECK(e.input_ids == c.at("input_ids").get<std::vector<std::int32_t>>());
    CHECK(e.labels == c.at("labels").get<std::vector<std::int32_t>>());
    truncated += e.input_ids.size() == o.cutoff_len;
    thought += tokenizer->decode(e.input_ids).find("<think>") != std::string::npos;
    ++per_template[name];
  }
  CHECK(per_template ==
        std::map<std::string, std::size_t>{
            {"llama3", 300}, {"qwen", 340}, {"qwen3", 340}, {"qwen3_nothink", 170}});
  CHECK(truncated > 50);  // the cutoffs bite
  CHECK(thought > 200);   // qwen3's empty thoughts, and the written ones
}

// What LLaMA-Factory's fix_jinja_template writes into a tokenizer with no
// template (an export of a base model trained under a named template
// ships it), character for character.
TEST_CASE("LLaMA-Factory's named templates as the Jinja it writes") {
  const auto tokenizer = text::load_tokenizer(kData / "tokenizers/byte_level_chat.json");
  const nlohmann::json golden = read_json(kData / "llamafactory/template_golden.json");
  REQUIRE(golden.at("jinja").size() == 6);
  const std::map<std::string, std::string> systems = {{"qwen+default_system", "Answer in French."},
                                                      {"llama3+default_system", "Tu es 'utile'."}};
  for (const auto& [key, jinja] : golden.at("jinja").items()) {
    CAPTURE(key);
    const std::string name = key.substr(0, key.find('+'));
    const std::optional<std::string> bos =
        name == "llama3" ? std::optional<std::string>("<|begin_of_text|>") : std::nullopt;
    text::LlamaFactoryTemplateOptions options;
    if (systems.contains(key)) options.default_system = systems.at(key);
    const auto chat = text::LlamaFactoryTemplate::find(name, *tokenizer, bos, options);
    REQUIRE(chat);
    CHECK(chat->jinja() == jinja.get<std::string>());
  }
}

TEST_CASE("a LLaMA-Factory template refuses dated tools and calls that are not JSON") {
  const auto tokenizer = text::load_tokenizer(kData / "tokenizers/byte_level_chat.json");
  const auto llama3 = text::LlamaFactoryTemplate::find("llama3", *tokenizer, std::nullopt);
  REQUIRE(llama3);
  text::SftExample e;
  e.where = "tools.json:3";
  e.turns = {{"user", "weather?"}, {"assistant", "sunny"}};
  e.tools = R"([{"name": "w"}])";
  CHECK_THROWS_WITH_AS(text::encode_example(*llama3, e, {}),
                       doctest::Contains("writes into a prompt with the day's date"), ConfigError);
  const auto qwen = text::LlamaFactoryTemplate::find("qwen", *tokenizer, std::nullopt);
  REQUIRE(qwen);
  e.tools = "not json";
  CHECK_THROWS_WITH_AS(text::encode_example(*qwen, e, {}),
                       doctest::Contains("the tools column is not a JSON list"), DataError);
  e.tools.clear();
  e.turns = {{"user", "weather?"}, {"function", R"({"name": "w"})"}};
  CHECK_THROWS_WITH_AS(text::encode_example(*qwen, e, {}),
                       doctest::Contains("has no \"name\" and \"arguments\""), DataError);
  CHECK_FALSE(text::LlamaFactoryTemplate::find("mistral", *tokenizer, std::nullopt));
  CHECK_THROWS_WITH_AS(text::LlamaFactoryTemplate::find("llama3", *tokenizer, "<s>"),
                       doctest::Contains("no token <s>"), ConfigError);
}
