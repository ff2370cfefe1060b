// ztrain's model against an independent implementation: golden files made
// by tools/make_golden.py from Hugging Face transformers (a tiny GPT-2 and
// tiny shapes of the Llama family: Llama with grouped key/value heads,
// Mistral, Qwen2 with q/k/v biases and a tied head, TinyLlama's multi-query
// proportions, Llama 3.2's llama3 RoPE scaling and tied head, Llama's
// attention_bias and mlp_bias with linear RoPE scaling; random non-trivial
// weights, non-default norm_eps, rope_theta and MLP width), computed in
// float64. The
// weights are imported through [model] init_from as a user would, and the
// fp32 forward and backward must give the file's loss, every logit and
// every parameter's gradient, element by element.
//
// Tolerances, pinned a few times above what is observed (float32 against
// float64): the loss within 5e-7, a few ulp (measured at most 2.2e-7,
// Mistral); each logit within 2e-6 of the largest logit (measured at most
// 0.56 of that, TinyLlama's shape); each gradient element within 2e-6 of its
// tensor's largest reference magnitude plus 1e-4 of its own (measured at
// most 0.50 of that).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "config/hf_model_import.h"
#include "io/safetensors.h"
#include "support.h"
#include "ztrain/model.h"
#include "ztrain/strategy.h"

namespace {

using namespace ztrain;

std::vector<float> tensor(const SafetensorsReader& file, const std::string& name) {
  const SafetensorsEntry* e = file.find(name);
  REQUIRE_MESSAGE(e, "no tensor " << name << " in " << file.path().string());
  std::vector<float> v(static_cast<std::size_t>(e->shape.numel()));
  file.read_f32(*e, v.data());
  return v;
}

struct Worst {
  double error = 0;  // the largest |got - want| seen
  double ratio = 0;  // the largest error / tolerance seen
};

// Every element of got within atol + rtol |want|.
Worst compare(const std::vector<float>& got, const std::vector<float>& want, double atol,
              double rtol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  Worst w;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err / (atol + rtol * std::fabs(want[i]));
    if (ratio > w.ratio) at = i;
    w.error = std::max(w.error, err);
    w.ratio = std::max(w.ratio, ratio);
  }
  INFO(what << ": element " << at << " is " << got[at] << ", the reference " << want[at]);
  CHECK(w.ratio <= 1.0);
  return w;
}

// The run of a golden case: its [model] given as keys with init_from (the
// generator's own TOML), or as the Hugging Face directory alone (`from`,
// config/hf_model_import.h reads its config.json).
Run golden_run(const std::filesystem::path& dir, const SafetensorsReader& ref, bool from_dir) {
  const std::string rest = "\n[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = 2\n";
  if (!from_dir)
    return test::make_run(ref.metadata().at("ztrain_model") + "init_from = \"" + dir.string() +
                          "\"" + rest);
  RunConfig config =
      RunConfig::parse("[model]\nfrom = \"" + dir.string() + "\"" + rest, "test.toml");
  resolve_model_dir(config);
  // Every key the generator gave is the one config.json gave.
  const toml::table want = toml::parse(ref.metadata().at("ztrain_model"));
  for (const auto& [key, node] : *want["model"].as_table()) {
    CAPTURE(std::string(key.str()));
    const toml::node* got = config.table().at_path("model." + std::string(key.str())).node();
    REQUIRE(got);
    CHECK(toml_value_text(*got) == toml_value_text(node));
  }
  return assemble(config, test::loader());
}

void check_case(const std::string& name, bool from_dir) {
  const auto dir = test::source_dir() / "tests" / "data" / "golden" / name;
  const SafetensorsReader ref(dir / "reference.safetensors");
  Run run = golden_run(dir, ref, from_dir);
  const ModelInfo info = run.model->info();
  const int B = 2, T = info.seq_len, V = info.vocab_size;

  std::vector<std::int32_t> inputs, targets;
  for (float x : tensor(ref, "inputs")) inputs.push_back(static_cast<std::int32_t>(x));
  for (float x : tensor(ref, "targets")) targets.push_back(static_cast<std::int32_t>(x));
  REQUIRE(inputs.size() == static_cast<std::size_t>(B) * T);
  const Batch batch{{B, T}, inputs.data(), targets.data()};
  const auto params = run.model->params();
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);

  std::vector<float> logits(static_cast<std::size_t>(B) * T * V);
  {
    StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
    run.model->forward_logits(batch, ctx, logits.data());
    losses.take();
  }
  const std::vector<float> want_logits = tensor(ref, "logits");
  double logit_scale = 0;
  for (float x : want_logits)
    logit_scale = std::max(logit_scale, static_cast<double>(std::fabs(x)));
  const Worst lw = compare(logits, want_logits, 2e-6 * logit_scale, 0, name + " logits");
  // The gradients of the mean loss over the batch's tokens (Hugging Face's).
  StepContext ctx(*run.strategy, params, *run.kernels, arena, losses,
                  1.0f / static_cast<float>(inputs.size()));
  run.model->forward_backward(batch, ctx);
  const double loss = losses.take();
  const double want_loss = std::strtod(ref.metadata().at("loss_fp64").c_str(), nullptr);
  CHECK(std::fabs(loss - want_loss) <= 5e-7);
  MESSAGE(name << ": loss error " << std::fabs(loss - want_loss) << ", largest logit error "
               << lw.error << " (" << lw.ratio << " of its tolerance)");

  Worst gw;
  for (ParamId p : params.ids()) {
    const ParamSpec& spec = params[p];
    const std::string hf = spec.hf_name.empty() ? spec.name : spec.hf_name;
    std::vector<float> want = tensor(ref, "grad." + hf);
    if (spec.hf_transposed) {  // the file holds (in, out); ztrain (out, in)
      const auto rows = static_cast<std::size_t>(spec.shape[0]),
                 cols = static_cast<std::size_t>(spec.shape[1]);
      std::vector<float> t(want.size());
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) t[r * cols + c] = want[c * rows + r];
      want.swap(t);
    }
    const TensorView g = run.strategy->grad_view(p);
    const std::vector<float> got(g.f32(), g.f32() + g.numel());
    double scale = 0;
    for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    const Worst w = compare(got, want, 2e-6 * scale, 1e-4, name + " gradient of " + hf);
    gw.ratio = std::max(gw.ratio, w.ratio);
  }
  MESSAGE(name << ": every gradient element within " << gw.ratio << " of its tolerance");
}

}  // namespace

TEST_CASE("GPT-2 matches Hugging Face's in float64: loss, logits, every gradient") {
  check_case("gpt2", false);
}

TEST_CASE("Llama with grouped KV heads matches Hugging Face's in float64") {
  check_case("llama", false);
}

TEST_CASE("Mistral matches Hugging Face's in float64") {
  check_case("mistral", false);
}

TEST_CASE("Qwen2 (q/k/v biases, tied head) matches Hugging Face's in float64") {
  check_case("qwen2", false);
}

TEST_CASE("TinyLlama's multi-query shape matches Hugging Face's in float64") {
  check_case("tinyllama", false);
}

TEST_CASE("Llama 3.2 (llama3 RoPE scaling, tied head) matches Hugging Face's in float64") {
  check_case("llama32", false);
}

TEST_CASE("Llama with attention and MLP biases, linear RoPE scaling, matches Hugging Face's") {
  check_case("llama_bias", false);
}

TEST_CASE(
    "a Hugging Face directory as the model: config.json's keys, the same loss and gradients") {
  for (const char* name :
       {"gpt2", "llama", "mistral", "qwen2", "tinyllama", "llama32", "llama_bias"}) {
    const std::string case_name = name;
    CAPTURE(case_name);
    check_case(case_name, true);
  }
}
