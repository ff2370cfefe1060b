// LLaMA-Factory's pt stage: the documents of tests/data/llamafactory's
// c4_demo (its own first rows) read by the host's reader must give the
// blocks and labels LLaMA-Factory's converter, template fix,
// PretrainDatasetProcessor under `datasets`' sharded, batched map, and
// transformers' DataCollatorForLanguageModeling give
// (pretrain_golden.json, tools/make_llamafactory_pretrain_golden.py):
// packed and not, with and without a named template, add_bos_token, a pad
// that is the EOS (separators untrained), shards and batches that each
// drop their remainder. Then the sft source lays each block in a row.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support.h"
#include "text/sft_reader.h"
#include "ztrain/data.h"
#include "ztrain/error.h"

namespace {

using namespace ztrain;
using ztrain::test::message_of;
using ztrain::test::source_dir;
using ztrain::test::TempDir;

const std::filesystem::path kData = source_dir() / "tests" / "data";

const nlohmann::json& golden() {
  static const nlohmann::json g = [] {
    std::ifstream in(kData / "llamafactory" / "pretrain_golden.json");
    return nlohmann::json::parse(in);
  }();
  return g;
}

// A model directory with the chat tokenizer and the case's
// tokenizer_config.json (no chat template: a base model's).
void model_dir(const TempDir& dir, const nlohmann::json& config) {
  std::filesystem::copy_file(kData / "tokenizers" / "byte_level_chat.json", dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
}

SftRequest pt_request(const TempDir& dir, const nlohmann::json& c) {
  SftRequest r;
  r.dataset_dir = (kData / "llamafactory").string();
  r.datasets = {"c4_demo"};
  r.model_dir = dir.path().string();
  r.chat_template = c.at("template");
  r.cutoff_len = c.at("cutoff_len");
  r.pretrain.on = true;
  r.pretrain.packing = c.at("packing");
  r.pretrain.workers = c.at("workers");
  r.pretrain.batch = c.at("batch");
  return r;
}

std::vector<std::int32_t> slice(const std::vector<std::int32_t>& v, std::size_t b, std::size_t e) {
  return {v.begin() + static_cast<std::ptrdiff_t>(b), v.begin() + static_cast<std::ptrdiff_t>(e)};
}

}  // namespace

TEST_CASE("pt: documents become LLaMA-Factory's blocks and labels") {
  std::size_t blocks = 0, untrained = 0;
  for (const auto& c : golden().at("cases")) {
    CAPTURE(c.at("template").get<std::string>());
    CAPTURE(c.at("packing").get<bool>());
    CAPTURE(c.at("cutoff_len").get<std::size_t>());
    CAPTURE(c.at("workers").get<std::size_t>());
    CAPTURE(c.at("batch").get<std::size_t>());
    const TempDir dir;
    model_dir(dir, c.at("tokenizer_config"));
    const SftExamples e = text::read_sft_examples(pt_request(dir, c));
    const auto& ids = c.at("input_ids");
    const auto& labels = c.at("labels");
    REQUIRE(e.count() == ids.size());
    for (std::size_t i = 0; i < e.count(); ++i) {
      CHECK(slice(e.input_ids, e.starts[i], e.starts[i + 1]) ==
            ids[i].get<std::vector<std::int32_t>>());
      CHECK(slice(e.labels, e.starts[i], e.starts[i + 1]) ==
            labels[i].get<std::vector<std::int32_t>>());
      for (auto l : labels[i]) untrained += l.get<std::int32_t>() == kIgnoreTarget;
    }
    CHECK(e.where.front().find("c4_demo.jsonl:1") != std::string::npos);
    blocks += e.count();
  }
  CHECK(blocks == 425);
  CHECK(untrained > 20);  // where the pad is the EOS, the separators
}

TEST_CASE("pt: refused where it means nothing or lacks a token") {
  const TempDir dir;
  model_dir(dir, {{"eos_token", "<|endoftext|>"}});
  nlohmann::json c = golden().at("cases").at(0);
  c["template"] = "chat.jinja";
  SftRequest r = pt_request(dir, c);
  r.template_where = "run.toml:9:1";
  CHECK(message_of<ConfigError>([&] { text::read_sft_examples(r); })
            .starts_with("run.toml:9:1: [data] template chat.jinja: the pt stage renders no "
                         "conversation"));
  const TempDir bare;
  model_dir(bare, nlohmann::json::object());
  r = pt_request(bare, golden().at("cases").at(0));
  CHECK(message_of<ConfigError>([&] {
          text::read_sft_examples(r);
        }).find("tokenizer_config.json names no eos_token") != std::string::npos);
  r.datasets = {"alpaca_en_demo", "glaive_toolcall_en_demo"};
  CHECK(message_of<ConfigError>([&] {
          text::read_sft_examples(r);
        }).find("glaive_toolcall_en_demo is sharegpt: the pt stage reads alpaca datasets") !=
        std::string::npos);
}
