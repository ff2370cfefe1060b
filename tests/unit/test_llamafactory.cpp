// LLaMA-Factory's training YAML as a run (config/llamafactory_import.h):
// its published examples (tests/data/llamafactory/lf_repo) loaded as
// `ztrain --llamafactory` loads them, every key the run it means with the
// YAML's place as its origin, LLaMA-Factory's and transformers' defaults
// where a key is absent, and each refusal naming the key.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "config/config.h"
#include "support.h"
#include "train/run_assembly.h"
#include "ztrain/error.h"

namespace {

using namespace ztrain;
namespace fs = std::filesystem;

const fs::path kRepo = test::source_dir() / "tests/data/llamafactory/lf_repo";
const fs::path kModel = test::source_dir() / "tests/data/golden/llama";

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A published YAML with its model (a hub name) replaced by a local
// directory, its deepspeed path made absolute, and `extra` appended.
fs::path yaml(const test::TempDir& dir, const std::string& example, const std::string& extra = "") {
  std::string text = std::regex_replace(read(kRepo / example), std::regex("model_name_or_path: .*"),
                                        "model_name_or_path: " + kModel.string());
  text = std::regex_replace(text, std::regex("deepspeed: examples/"),
                            "deepspeed: " + (kRepo / "examples").string() + "/");
  const fs::path out = dir / "train.yaml";
  std::ofstream(out) << text << extra;
  return out;
}

RunConfig load(const fs::path& file, std::vector<std::string> overrides = {}) {
  TrainArgs args;
  args.llamafactory = file;
  args.overrides = std::move(overrides);
  return load_run_config(args);
}

std::string value(const RunConfig& c, const std::string& key) {
  const toml::node* n = c.table().at_path(key).node();
  REQUIRE_MESSAGE(n, "no " << key);
  return toml_value_text(*n);
}

std::string refusal(const std::string& example, const std::string& extra,
                    std::vector<std::string> overrides = {}) {
  test::TempDir dir;
  const fs::path file = yaml(dir, example, extra);
  return test::message_of<ConfigError>([&] { load(file, overrides); });
}

}  // namespace

TEST_CASE("LLaMA-Factory's published LoRA YAML becomes the run it describes, key by key") {
  test::TempDir dir;
  const fs::path file = yaml(dir, "examples/train_lora/qwen3_lora_sft.yaml");
  const RunConfig c = load(file);
  const std::pair<const char*, const char*> want[] = {
      {"model.init_from", nullptr},  // the directory, through [model] from
      {"model.finetuning_type", "\"lora\""},
      {"model.lora_rank", "8"},
      {"model.lora_target", "[\"all\"]"},
      {"model.activation_checkpointing", "true"},  // LLaMA-Factory's default
      {"model.seq_len", "2047"},                   // cutoff_len - 1 places a row
      {"data.plugin", "\"sft\""},
      {"data.dataset", "[\"identity\", \"alpaca_en_demo\"]"},
      {"data.dataset_dir", "\"data\""},
      {"data.cutoff_len", "2048"},
      {"data.max_samples", "1000"},
      {"data.seed", "42"},
      {"train.micro_batch_size", "1"},
      {"train.grad_accum", "8"},
      {"train.lr", "1e-04"},
      {"train.epochs", "3.0"},
      {"train.epoch_steps", "\"transformers\""},
      {"train.schedule", "\"hf_cosine\""},
      {"train.warmup_ratio", "0.1"},
      {"train.precision", "\"bf16\""},
      {"train.grad_accum_dtype", "\"fp32\""},
      {"train.weight_decay", "0.0"},  // transformers' defaults, not ztrain's
      {"train.betas", "[0.9, 0.999]"},
      {"train.grad_clip", "1.0"},
      {"train.seed", "42"},
      {"train.log_every", "10"},
      {"train.checkpoint_every", "500"},
      {"train.keep_last", "0"},  // transformers keeps every checkpoint
      {"train.eval_every", "0"},
      {"train.out_dir", "\"saves/qwen3-4b/lora/sft\""},
      {"comm.timeout", "1.8e+08"}};
  for (const auto& [key, v] : want) {
    const std::string k = key;
    CAPTURE(k);
    if (v) CHECK(value(c, key) == v);
  }
  CHECK(value(c, "model.init_from") == "\"" + kModel.string() + "\"");
  // Each value names the YAML key it came from, or the default it is.
  const std::string name = file.string();
  CHECK(c.where("train.lr") == name + ":32:16: learning_rate");
  CHECK(c.where("train.schedule") == name + ":34:20: lr_scheduler_type");
  CHECK(c.where("train.weight_decay") == name + ": weight_decay absent (LLaMA-Factory's default)");
  // Keys that change nothing here say so.
  std::string notes;
  for (const std::string& n : c.notes()) notes += n + "\n";
  CHECK(notes.find(":3:20: trust_remote_code: no effect") != std::string::npos);
  CHECK(notes.find("preprocessing_num_workers: no effect") != std::string::npos);
}

TEST_CASE("LoRA's keys beyond the published ones: use_rslora, and lora keys without LoRA") {
  test::TempDir dir;
  CHECK(value(load(yaml(dir, "examples/train_lora/qwen3_lora_sft.yaml", "use_rslora: true\n")),
              "model.use_rslora") == "true");
  // LLaMA-Factory reads a method's keys under that method only: said, not set.
  const RunConfig full =
      load(yaml(dir, "examples/train_full/qwen3_full_sft.yaml", "lora_rank: 16\n"));
  CHECK(!full.table().at_path("model.lora_rank"));
  std::string notes;
  for (const std::string& n : full.notes()) notes += n + "\n";
  CHECK(notes.find("lora_rank: no effect with finetuning_type full") != std::string::npos);
}

TEST_CASE("the full YAML's deepspeed config is read as --deepspeed reads it") {
  test::TempDir dir;
  const RunConfig c = load(yaml(dir, "examples/train_full/qwen3_full_sft.yaml"));
  CHECK(value(c, "model.finetuning_type") == "\"full\"");
  CHECK(value(c, "strategy.plugin") == "\"zero3\"");
  // "auto" takes the YAML's values, as the Trainer fills DeepSpeed's.
  CHECK(value(c, "train.micro_batch_size") == "1");
  CHECK(value(c, "train.grad_accum") == "2");
  CHECK(value(c, "train.precision") == "\"bf16\"");
  CHECK(c.where("strategy.plugin").find("ds_z3_config.json") != std::string::npos);
}

TEST_CASE("LLaMA-Factory's published pretraining YAML is stage pt, packed as it packs") {
  test::TempDir dir;
  const RunConfig c = load(yaml(dir, "examples/train_lora/qwen3_lora_pretrain.yaml"));
  CHECK(value(c, "data.plugin") == "\"sft\"");
  CHECK(value(c, "data.stage") == "\"pt\"");
  CHECK(c.where("data.stage").find(":6:8: stage") != std::string::npos);
  CHECK(value(c, "data.packing") == "true");  // pt's default
  CHECK(c.where("data.packing").find("packing absent (LLaMA-Factory's default)") !=
        std::string::npos);
  CHECK(value(c, "data.preprocessing_num_workers") == "16");  // its shards: it packs each alone
  CHECK(value(c, "data.dataset") == "[\"c4_demo\"]");
  CHECK(value(c, "model.seq_len") == "2047");
  CHECK_FALSE(c.table().at_path("data.template"));
  const RunConfig evaluated = load(yaml(dir, "examples/train_lora/qwen3_lora_pretrain.yaml",
                                        "eval_dataset: c4_demo\neval_strategy: steps\n"));
  CHECK(value(evaluated, "data.eval_dataset") == "[\"c4_demo\"]");
  CHECK(evaluated.where("data.eval_dataset").find(":45:15: eval_dataset") != std::string::npos);
  const RunConfig unpacked =
      load(yaml(dir, "examples/train_lora/qwen3_lora_pretrain.yaml", "packing: false\n"));
  CHECK(value(unpacked, "data.packing") == "false");
}

TEST_CASE("the YAML's template and enable_thinking are the data source's, from their places") {
  test::TempDir dir;
  const RunConfig c =
      load(yaml(dir, "examples/train_lora/qwen3_lora_sft.yaml", "enable_thinking: false\n"));
  CHECK(value(c, "data.template") == "\"qwen3_nothink\"");
  CHECK(c.where("data.template").find(":14:11: template") != std::string::npos);
  CHECK(value(c, "data.enable_thinking") == "false");
  const RunConfig system = load(
      yaml(dir, "examples/train_lora/qwen3_lora_sft.yaml", "default_system: Answer briefly.\n"));
  CHECK(value(system, "data.default_system") == "\"Answer briefly.\"");
  const RunConfig auto_template =
      load(yaml(dir, "examples/train_lora/qwen3_lora_sft.yaml"), {"data.template=\"auto\""});
  CHECK(value(auto_template, "data.template") == "\"auto\"");
}

TEST_CASE("what LLaMA-Factory means and ztrain does not build is refused, naming the key") {
  const std::string lora = "examples/train_lora/qwen3_lora_sft.yaml";
  const std::pair<std::string, std::string> cases[] = {
      {"neat_packing: false\npacking: true\n", "packing is true without neat_packing"},
      {"use_dora: true\n", "use_dora is true: not built"},
      {"optim: adafactor\n", "optim is adafactor"},
      {"report_to_typo: none\n", "report_to_typo is not a LLaMA-Factory key ztrain knows"},
      {"eval_strategy: epoch\n", "eval_strategy is epoch"},
      {"quantization_bit: 4\n", "quantization_bit is 4: QLoRA's quantized base is not built"},
      {"image_max_pixels: 262144\n", "multimodal models are not built"},
      {"ray_num_workers: 4\n", "Ray is not built: ztrain starts its ranks itself"}};
  for (const auto& [extra, text] : cases) {
    CAPTURE(extra);
    CHECK(refusal(lora, extra).find(text) != std::string::npos);
  }
  // Keys given twice are a YAML error; these replace the file's own.
  test::TempDir dir;
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = std::regex_replace(read(yaml(dir, lora)), std::regex(from), to);
    std::ofstream(dir / "edited.yaml") << text;
    return test::message_of<ConfigError>([&] { load(dir / "edited.yaml"); });
  };
  CHECK(with("model_name_or_path: .*", "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507")
            .find("huggingface-cli download Qwen/Qwen3-4B-Instruct-2507 --local-dir DIR") !=
        std::string::npos);
  CHECK(with("stage: sft", "stage: dpo").find("stage is dpo") != std::string::npos);
  CHECK(with("do_train: true", "do_train: false").find("do_train is not true") !=
        std::string::npos);
  CHECK(with("lr_scheduler_type: cosine", "lr_scheduler_type: polynomial")
            .find("lr_scheduler_type is polynomial") != std::string::npos);
  CHECK(with("report_to: none", "report_to: wandb").find("report_to names wandb") !=
        std::string::npos);
}
