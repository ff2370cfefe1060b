// Hugging Face model directories as the model (config/hf_model_import.h):
// what each config.json key becomes, what is refused naming the key, the
// notes. (test_golden trains the two golden directories through `from`.)
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "config/hf_model_import.h"
#include "support.h"
#include "ztrain/model.h"

using namespace ztrain;

namespace {

nlohmann::json golden_config(const std::string& name) {
  std::ifstream in(test::source_dir() / "tests/data/golden" / name / "config.json");
  return nlohmann::json::parse(in);
}

// The run of [model] from = a directory holding `config` (and extra keys).
RunConfig resolved(const test::TempDir& dir, const nlohmann::json& config,
                   const std::string& extra = "") {
  std::ofstream(dir / "config.json") << config.dump(1);
  RunConfig c =
      RunConfig::parse("[model]\nfrom = \"" + dir.path().string() + "\"\n" + extra, "run.toml");
  resolve_model_dir(c);
  return c;
}

std::string value(const RunConfig& c, const std::string& key) {
  const toml::node* n = c.table().at_path(key).node();
  return n ? toml_value_text(*n) : "(none)";
}

std::string refusal(const test::TempDir& dir, const nlohmann::json& config) {
  return test::message_of<ConfigError>([&] { resolved(dir, config); });
}

}  // namespace

TEST_CASE("hf model: Llama's keys, rope_theta in either place, long contexts capped with a note") {
  test::TempDir dir;
  auto j = golden_config("llama");
  RunConfig c = resolved(dir, j);
  CHECK(value(c, "model.arch") == "\"llama\"");
  CHECK(value(c, "model.n_kv_head") == "2");
  CHECK(value(c, "model.rope_theta") == "5000.0");
  CHECK(value(c, "model.init_from") == "\"" + dir.path().string() + "\"");
  CHECK(c.table().at_path("model.from").node() == nullptr);
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["max_position_embeddings"] = 131072;
  c = resolved(dir, j);
  CHECK(value(c, "model.rope_theta") == "5e+05");
  CHECK(value(c, "model.seq_len") == "2048");
  CHECK(value(c, "model.max_positions") == "131072");  // what an export says again
  REQUIRE(c.notes().size() == 1);
  CHECK(c.notes()[0].find("max_position_embeddings is 131072: seq_len 2048") != std::string::npos);
  // The run's own key wins, said.
  c = resolved(dir, j, "seq_len = 256\n");
  CHECK(value(c, "model.seq_len") == "256");
  CHECK(c.notes().back().find("run.toml:3:1: model.seq_len = 256 in place of 2048") !=
        std::string::npos);
}

TEST_CASE("hf model: what changes the computation and is not built is refused naming the key") {
  test::TempDir dir;
  const auto llama = golden_config("llama");
  auto j = llama;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  CHECK(refusal(dir, j).find("config.json: rope_scaling is") != std::string::npos);
  CHECK(refusal(dir, j).find("RoPE scaling \"yarn\" is not built") != std::string::npos);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  CHECK(refusal(dir, j).find("RoPE type \"llama3\" needs low_freq_factor") != std::string::npos);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"attention_factor", 1.5}};
  CHECK(refusal(dir, j).find("config.json: rope_scaling.attention_factor is 1.5: not built for "
                             "RoPE type \"linear\"") != std::string::npos);
  j["rope_scaling"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  CHECK(refusal(dir, j).find("rope_scaling.partial_rotary_factor is 0.5") != std::string::npos);
  j = llama;
  j["tie_word_embeddings"] = "yes";
  CHECK(refusal(dir, j).find("config.json: tie_word_embeddings is \"yes\"; expected a boolean") !=
        std::string::npos);
  j = llama;
  j["model_type"] = "gemma";
  CHECK(refusal(dir, j).find("model_type is \"gemma\": ztrain builds gpt2 and the Llama family") !=
        std::string::npos);
  j = golden_config("qwen2");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  CHECK(refusal(dir, j).find("sliding_window is 8, shorter than seq_len 13") != std::string::npos);
  j["use_sliding_window"] = false;
  CHECK_NOTHROW(resolved(dir, j));
  j["layer_types"] = {"full_attention", "chunked_attention"};
  CHECK(refusal(dir, j).find("layer_types holds \"chunked_attention\"") != std::string::npos);
  j = golden_config("qwen2");
  j["attention_bias"] = true;  // Qwen2's class has no such key
  CHECK(refusal(dir, j).find("config.json: attention_bias is true: a key ztrain does not know") !=
        std::string::npos);
  j = llama;
  j["model_type"] = "mistral";
  j["sliding_window"] = 8;
  CHECK(refusal(dir, j).find("sliding_window is 8, shorter than seq_len 13") != std::string::npos);
  j["sliding_window"] = 4096;
  CHECK_NOTHROW(resolved(dir, j));
  j = llama;
  j["some_new_key"] = 3;
  CHECK(refusal(dir, j).find("config.json: some_new_key is 3: a key ztrain does not know") !=
        std::string::npos);
  j = llama;
  j["hidden_act"] = "gelu";
  CHECK(refusal(dir, j).find("hidden_act is \"gelu\"") != std::string::npos);
  auto g = golden_config("gpt2");
  g["activation_function"] = "relu";
  CHECK(refusal(dir, g).find("activation_function is \"relu\"") != std::string::npos);
  CHECK(test::message_of<ConfigError>([] {
          RunConfig c = RunConfig::parse("[model]\nfrom = \"/nonexistent/dir\"\n", "run.toml");
          resolve_model_dir(c);
        }).find("'/nonexistent/dir' has no readable config.json") != std::string::npos);
}

TEST_CASE("hf model: the Llama family's variants become [model] keys") {
  test::TempDir dir;
  RunConfig c = resolved(dir, golden_config("qwen2"));
  CHECK(value(c, "model.attention_bias") == "\"qkv\"");
  CHECK(value(c, "model.tie_embeddings") == "true");
  CHECK(value(c, "model.rope_scaling") == "(none)");
  CHECK(value(c, "model.rope_theta") == "1e+06");
  // Llama 3.1's scaling in transformers 4's form, beside rope_theta.
  auto j = golden_config("llama");
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  c = resolved(dir, j);
  CHECK(value(c, "model.rope_scaling") == "\"llama3\"");
  CHECK(value(c, "model.rope_factor") == "32.0");
  CHECK(value(c, "model.rope_original_max_positions") == "8192.0");
  CHECK(value(c, "model.rope_theta") == "5e+05");
  CHECK(value(c, "model.attention_bias") == "\"all\"");
  CHECK(value(c, "model.mlp_bias") == "true");
  CHECK(value(c, "model.tie_embeddings") == "false");
  c = resolved(dir, golden_config("mistral"));
  CHECK(value(c, "model.attention_bias") == "\"none\"");
}

// The export's config.json (Model::hf_config_json) read back: every [model]
// key of every golden family the same. (transformers' own reading of the
// export is checked in development by tools/check_hf_export.py.)
TEST_CASE("hf model: the exported config.json imports as the same [model], every family") {
  const auto lib = test::loader().load("model", "transformer");
  // The last: a Llama made for a longer context than it trains (seq_len
  // 2048 of 131072): its export says 131072 again.
  auto long_context = golden_config("llama");
  long_context["max_position_embeddings"] = 131072;
  for (const char* name : {"gpt2", "llama", "mistral", "qwen2", "tinyllama", "llama32",
                           "llama_bias", "long_context"}) {
    const std::string family = name;
    CAPTURE(family);
    test::TempDir dir, out;
    const RunConfig c =
        resolved(dir, family == "long_context" ? long_context : golden_config(family));
    const auto model =
        lib.create<Model>(c.validate("model", lib.options(), {"plugin", "init_from"}));
    std::ofstream(out / "config.json") << model->hf_config_json();
    if (family == "long_context")
      CHECK(nlohmann::json::parse(model->hf_config_json())["max_position_embeddings"] == 131072);
    RunConfig back =
        RunConfig::parse("[model]\nfrom = \"" + out.path().string() + "\"\n", "run.toml");
    resolve_model_dir(back);
    const toml::table& want = *c.table().at_path("model").as_table();
    const toml::table& got = *back.table().at_path("model").as_table();
    CHECK(got.size() == want.size());
    for (const auto& [key, node] : want) {
      if (key.str() == "init_from") continue;
      CAPTURE(std::string(key.str()));
      CHECK(value(back, "model." + std::string(key.str())) == toml_value_text(node));
    }
  }
}

TEST_CASE("hf model: GPT-2's keys, and its dropout said in a note") {
  test::TempDir dir;
  auto g = golden_config("gpt2");
  g["resid_pdrop"] = 0.1;
  const RunConfig c = resolved(dir, g);
  CHECK(value(c, "model.arch") == "\"gpt2\"");
  CHECK(value(c, "model.seq_len") == "13");
  CHECK(value(c, "model.intermediate_size") == "128");
  REQUIRE(c.notes().size() == 1);
  CHECK(c.notes()[0].find("resid_pdrop is 0.1: ztrain trains without dropout") !=
        std::string::npos);
}
