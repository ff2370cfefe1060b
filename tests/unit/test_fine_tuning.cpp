// Fine-tuning's mechanics around the math (test_golden holds LoRA's math
// to PEFT): which parameters a method trains, where adapters start, what
// the frozen base costs in the estimate, and what each refusal names.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "checkpoint/weights.h"
#include "support.h"
#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace {

using namespace ztrain;

const std::string kLlama =
    "[model]\narch = \"llama\"\nn_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\n"
    "vocab_size = 64\nseq_len = 16\nintermediate_size = 48\n";
const std::string kRest = "[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = 2\n";

std::vector<float> read(Run& run, ParamId p) {
  const auto params = run.model->params();
  std::vector<float> v(static_cast<std::size_t>(params[p].shape.numel()));
  run.strategy->read_param(p, v.data());
  return v;
}

std::vector<std::string> trained_names(const Run& run) {
  std::vector<std::string> names;
  for (const ParamSpec& p : run.model->params())
    if (p.trainable) names.push_back(p.name);
  return names;
}

}  // namespace

TEST_CASE("LoRA's adapters start as PEFT's, from the seed, whether the base is drawn or imported") {
  const std::string lora = "finetuning_type = \"lora\"\nlora_rank = 4\n";
  Run drawn = test::make_run(kLlama + lora + kRest);
  const auto params = drawn.model->params();
  test::TempDir dir;
  export_weights(*drawn.model, *drawn.strategy, dir.path(), DType::f32);
  Run imported =
      test::make_run(kLlama + lora + "init_from = \"" + dir.path().string() + "\"\n" + kRest);
  std::size_t adapters = 0;
  for (ParamId p : params.ids()) {
    const ParamSpec& spec = params[p];
    CHECK(spec.trainable == spec.adapter);
    const std::vector<float> a = read(drawn, p), b = read(imported, p);
    CHECK(a == b);  // the base through the export, the adapters from the seed
    if (!spec.adapter) continue;
    ++adapters;
    const bool is_a = spec.name.ends_with("lora_A.weight");
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
    CAPTURE(spec.name);
    if (is_a) {
      CHECK(std::all_of(a.begin(), a.end(), [&](float x) { return std::fabs(x) < bound; }));
      // U(-bound, bound): the spread of a uniform, not a constant.
      double sq = 0;
      for (float x : a) sq += static_cast<double>(x) * x;
      CHECK(std::sqrt(sq / static_cast<double>(a.size())) ==
            doctest::Approx(bound / std::sqrt(3.0)).epsilon(0.25));
    } else {
      CHECK(std::all_of(a.begin(), a.end(), [](float x) { return x == 0.0f; }));
    }
  }
  CHECK(adapters == 2 * 2 * 7);  // two blocks, seven projections, A and B
  // Merged with B = 0 the export is the base itself: no adapter in it.
  CHECK(std::filesystem::exists(dir / "adapter" / "adapter_model.safetensors"));
}

TEST_CASE("lora_target picks projections by name, and GPT-2's c_proj is both of a block's") {
  Run llama = test::make_run(
      kLlama + "finetuning_type = \"lora\"\nlora_target = \"q_proj, v_proj\"\n" + kRest);
  const std::vector<std::string> want = {"model.layers.0.self_attn.q_proj.lora_A.weight",
                                         "model.layers.0.self_attn.q_proj.lora_B.weight",
                                         "model.layers.0.self_attn.v_proj.lora_A.weight",
                                         "model.layers.0.self_attn.v_proj.lora_B.weight",
                                         "model.layers.1.self_attn.q_proj.lora_A.weight",
                                         "model.layers.1.self_attn.q_proj.lora_B.weight",
                                         "model.layers.1.self_attn.v_proj.lora_A.weight",
                                         "model.layers.1.self_attn.v_proj.lora_B.weight"};
  CHECK(trained_names(llama) == want);
  Run gpt2 = test::make_run(
      "[model]\narch = \"gpt2\"\nn_layer = 1\nn_embd = 32\nn_head = 4\nvocab_size = 64\n"
      "seq_len = 16\nfinetuning_type = \"lora\"\nlora_target = [\"c_proj\"]\n" +
      kRest);
  CHECK(trained_names(gpt2) ==
        std::vector<std::string>{"h.0.attn.c_proj.lora_A.weight", "h.0.attn.c_proj.lora_B.weight",
                                 "h.0.mlp.c_proj.lora_A.weight", "h.0.mlp.c_proj.lora_B.weight"});
}

TEST_CASE("freeze trains what LLaMA-Factory's freeze trains") {
  const auto trained = [](const std::string& keys) {
    return trained_names(test::make_run(kLlama + "finetuning_type = \"freeze\"\n" + keys + kRest));
  };
  // The last block by default (2 of 2 here: both), the first with -1.
  CHECK(trained("freeze_trainable_layers = 1\n").size() == 9);
  for (const std::string& n : trained("freeze_trainable_layers = -1\n"))
    CHECK(n.starts_with("model.layers.0."));
  CHECK(trained("freeze_trainable_layers = 1\nfreeze_trainable_modules = \"mlp\"\n") ==
        std::vector<std::string>{"model.layers.1.mlp.gate_proj.weight",
                                 "model.layers.1.mlp.up_proj.weight",
                                 "model.layers.1.mlp.down_proj.weight"});
  // An extra module by LLaMA-Factory's substring test: "norm" reaches the
  // blocks' norms too.
  const auto extra = trained(
      "freeze_trainable_layers = 1\nfreeze_trainable_modules = \"mlp\"\n"
      "freeze_extra_modules = \"norm\"\n");
  CHECK(extra.size() == 3 + 4 + 1);
  CHECK(std::count(extra.begin(), extra.end(), "model.norm.weight") == 1);
  CHECK(std::count(extra.begin(), extra.end(), "model.layers.0.input_layernorm.weight") == 1);
}

TEST_CASE("the estimate holds the frozen base in the working precision, state for the rest") {
  Run full = test::make_run(kLlama + kRest + "precision = \"bf16\"\n");
  Run lora =
      test::make_run(kLlama + "finetuning_type = \"lora\"\n" + kRest + "precision = \"bf16\"\n");
  EstimateArgs a;
  a.params = lora.model->params();
  a.precision = DType::bf16;
  a.grad_dtype = DType::bf16;
  std::uint64_t base = 0, adapters = 0;
  for (const ParamSpec& p : a.params)
    (p.adapter ? adapters : base) += static_cast<std::uint64_t>(p.shape.numel());
  const MemoryEstimate e = lora.strategy->estimate(a);
  // Each part padded to 16 elements a tensor at most.
  const std::uint64_t slack = 16 * a.params.size();
  const auto& device = e.bytes[Tier::device];
  CHECK(device[Category::params] >= 2 * (base + adapters));
  CHECK(device[Category::params] <= 2 * (base + adapters + 2 * slack));
  CHECK(device[Category::grads] >= 2 * adapters);
  CHECK(device[Category::grads] <= 2 * (adapters + slack));
  CHECK(device[Category::optimizer] <= 12 * (adapters + slack));
  CHECK(full.model->params().size() + 28 == a.params.size());
}

TEST_CASE("fine-tuning keys are refused where they mean nothing, naming the key") {
  const auto refusal = [](const std::string& keys) {
    return test::message_of<ConfigError>([&] { test::make_run(kLlama + keys + kRest); });
  };
  CHECK(
      refusal("lora_rank = 4\n").find("[model] lora_rank is a key of finetuning_type = \"lora\"") !=
      std::string::npos);
  CHECK(refusal("finetuning_type = \"lora\"\nfreeze_trainable_layers = 1\n")
            .find("freeze_trainable_layers is a key of finetuning_type = \"freeze\"") !=
        std::string::npos);
  CHECK(refusal("finetuning_type = \"lora\"\nlora_dropout = 0.05\n").find("set lora_dropout = 0") !=
        std::string::npos);
  CHECK(refusal("finetuning_type = \"lora\"\nlora_target = \"qproj\"\n")
            .find("'qproj' is no projection of Llama's blocks; they are down_proj, gate_proj, "
                  "k_proj, o_proj, q_proj, up_proj, v_proj") != std::string::npos);
  CHECK(refusal("finetuning_type = \"freeze\"\nfreeze_extra_modules = \"wte\"\n")
            .find("'wte' is no module outside the blocks; they are embed_tokens, lm_head, norm") !=
        std::string::npos);
  CHECK(refusal("finetuning_type = \"freeze\"\nfreeze_trainable_layers = 0\n")
            .find("every parameter of the model is frozen") != std::string::npos);
}

// At the start B is zero, so every run's output and its gradient are the
// base's, and B's gradient, dy^T (scale x A^T), is the scale times a
// quantity all three runs share: rsLoRA's alpha / sqrt(rank) at alpha 8,
// rank 4 is plain LoRA's at alpha 16, and twice plain LoRA's at alpha 8.
TEST_CASE("use_rslora scales the adapters by lora_alpha / sqrt(lora_rank)") {
  const auto b_grad = [](const std::string& keys) {
    Run run = test::make_run(kLlama + "finetuning_type = \"lora\"\nlora_rank = 4\n" + keys + kRest);
    const auto params = run.model->params();
    std::vector<std::int32_t> inputs(2 * 16), targets(2 * 16);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      inputs[i] = static_cast<std::int32_t>(i * 7 % 64);
      targets[i] = static_cast<std::int32_t>(i * 5 % 64);
    }
    Arena arena(*run.device);
    LossSum losses(*run.device, *run.kernels);
    StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
    run.strategy->begin_micro_step(true);
    run.model->forward_backward({{2, 16}, inputs.data(), targets.data()}, ctx);
    for (ParamId p : params.ids())
      if (params[p].name == "model.layers.1.mlp.down_proj.lora_B.weight") {
        const TensorView g = run.strategy->grad_view(p);
        return std::vector<float>(g.f32(), g.f32() + g.numel());
      }
    FAIL("no adapter");
    return std::vector<float>{};
  };
  const std::vector<float> rs = b_grad("lora_alpha = 8\nuse_rslora = true\n"),
                           alpha16 = b_grad("lora_alpha = 16\n"),
                           alpha8 = b_grad("lora_alpha = 8\n");
  CHECK(rs == alpha16);
  CHECK(std::any_of(rs.begin(), rs.end(), [](float x) { return x != 0.0f; }));
  for (std::size_t i = 0; i < rs.size(); ++i) CHECK(alpha8[i] * 2.0f == rs[i]);
}
