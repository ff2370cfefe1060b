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
//
// Fine-tuning (tools/make_sft_golden.py, the Llama and Qwen2 cases): six
// examples of 4 to 13 tokens with Hugging Face labels (-100 on a masked
// prompt, a masked history turn, none on one), each run alone by
// transformers, the loss the mean over every trained label of the six.
// ztrain lays them out one a row, padded, and packed several to a row with
// positions restarting per example; both give that loss and every
// gradient, within the same tolerances.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "checkpoint/weights.h"
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
// `tuning`: more [model] keys (a fine-tuning method's).
Run golden_run(const std::filesystem::path& dir, const SafetensorsReader& ref, bool from_dir,
               int micro_batch = 2, const std::string& tuning = "") {
  const std::string rest = "\n[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = " +
                           std::to_string(micro_batch) + "\n";
  if (!from_dir)
    return test::make_run(ref.metadata().at("ztrain_model") + tuning + "init_from = \"" +
                          dir.string() + "\"" + rest);
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

// Every parameter's gradient in `run` against the file's grad.<name>.
double check_gradients(const Run& run, const SafetensorsReader& ref, const std::string& what) {
  const auto params = run.model->params();
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
    const Worst w = compare(got, want, 2e-6 * scale, 1e-4, what + " gradient of " + hf);
    gw.ratio = std::max(gw.ratio, w.ratio);
  }
  return gw.ratio;
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

  const double ratio = check_gradients(run, ref, name);
  MESSAGE(name << ": every gradient element within " << ratio << " of its tolerance");
}

// A fine-tuning batch: rows of T inputs, targets and (packed) positions.
struct SftRows {
  std::vector<std::int32_t> inputs, targets, positions;
  int rows = 0;
};

// The examples of `ref` in rows of T: each example of L tokens takes L - 1
// places (its tokens 0..L-2, its labels 1..L-1), one a row, or packed in
// file order into the first row with room; padding input 0, target -100.
SftRows sft_rows(const SafetensorsReader& ref, int T, bool packed) {
  const int n = std::stoi(ref.metadata().at("examples"));
  std::vector<std::vector<std::int32_t>> ids(n), labels(n);
  for (int i = 0; i < n; ++i)
    for (const char* what : {"ids", "labels"})
      for (float x : tensor(ref, std::string(what) + "." + std::to_string(i)))
        (what[0] == 'i' ? ids : labels)[i].push_back(static_cast<std::int32_t>(x));
  std::vector<std::vector<int>> rows;
  std::vector<int> used;
  for (int i = 0; i < n; ++i) {
    const int places = static_cast<int>(ids[i].size()) - 1;
    std::size_t r = 0;
    while (r < rows.size() && (!packed || used[r] + places > T)) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(i);
    used[r] += places;
  }
  SftRows out;
  out.rows = static_cast<int>(rows.size());
  for (const auto& row : rows) {
    int at = 0;
    for (int i : row) {
      for (std::size_t t = 0; t + 1 < ids[i].size(); ++t) {
        out.inputs.push_back(ids[i][t]);
        out.targets.push_back(labels[i][t + 1]);
        out.positions.push_back(static_cast<std::int32_t>(t));
      }
      at += static_cast<int>(ids[i].size()) - 1;
    }
    for (int t = at; t < T; ++t) {
      out.inputs.push_back(0);
      out.targets.push_back(kIgnoreTarget);
      out.positions.push_back(t - at);
    }
  }
  return out;
}

void check_sft(const std::string& name, bool packed) {
  const auto dir = test::source_dir() / "tests" / "data" / "golden" / name;
  const SafetensorsReader model_ref(dir / "reference.safetensors");
  const SafetensorsReader ref(dir / "sft_reference.safetensors");
  const int T = std::stoi(ref.metadata().at("T"));
  const SftRows rows = sft_rows(ref, T, packed);
  Run run = golden_run(dir, model_ref, false, rows.rows);
  const Batch batch{{rows.rows, T},
                    rows.inputs.data(),
                    rows.targets.data(),
                    packed ? rows.positions.data() : nullptr};
  const int trained = std::stoi(ref.metadata().at("trained"));
  CHECK(std::count_if(rows.targets.begin(), rows.targets.end(),
                      [](std::int32_t t) { return t != kIgnoreTarget; }) == trained);
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  const auto params = run.model->params();  // the context keeps a reference
  StepContext ctx(*run.strategy, params, *run.kernels, arena, losses,
                  1.0f / static_cast<float>(trained));
  run.model->forward_backward(batch, ctx);
  // The losses add each row's mean over its places; the trainer's factor
  // makes that the mean over the trained tokens.
  const double loss = losses.take() * static_cast<double>(rows.inputs.size()) / trained;
  const double want_loss = std::strtod(ref.metadata().at("loss_fp64").c_str(), nullptr);
  const std::string what = name + (packed ? " packed" : " one example a row");
  CHECK(std::fabs(loss - want_loss) <= 5e-7);
  const double ratio = check_gradients(run, ref, what);
  MESSAGE(what << " (" << rows.rows << " rows): loss error " << std::fabs(loss - want_loss)
               << ", every gradient element within " << ratio << " of its tolerance");
}

// The adapters' values of a LoRA golden file (lora.<name>), a fresh
// optimizer.
class AdapterValues final : public StateSource {
 public:
  AdapterValues(const SafetensorsReader& ref, const ParamSpecs& params)
      : ref_(ref), params_(params) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    REQUIRE(params_[p].adapter);
    if (a != StateArray::master) return std::fill(out, out + count, 0.0f);
    const std::vector<float> v = tensor(ref_, "lora." + params_[p].name);
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(first), count, out);
  }

 private:
  const SafetensorsReader& ref_;
  const ParamSpecs& params_;
};

// LoRA (tools/make_lora_golden.py): PEFT's adapters of rank 4, alpha 8 on
// every projection of the blocks, the base frozen, the fine-tuning
// examples one a row and (rotary models) packed: the loss and the
// adapters' gradients; the base gets none.
void check_lora(const std::string& name, bool packed) {
  const auto dir = test::source_dir() / "tests" / "data" / "golden" / name;
  const SafetensorsReader model_ref(dir / "reference.safetensors");
  const SafetensorsReader ref(dir / "lora_reference.safetensors");
  const int T = std::stoi(ref.metadata().at("T"));
  const SftRows rows = sft_rows(ref, T, packed);
  Run run = golden_run(dir, model_ref, false, rows.rows,
                       "finetuning_type = \"lora\"\nlora_rank = " + ref.metadata().at("lora_rank") +
                           "\nlora_alpha = " + ref.metadata().at("lora_alpha") + "\n");
  const auto params = run.model->params();  // the context keeps a reference
  AdapterValues adapters(ref, params);
  run.strategy->load_state(adapters);
  const Batch batch{{rows.rows, T},
                    rows.inputs.data(),
                    rows.targets.data(),
                    packed ? rows.positions.data() : nullptr};
  const int trained = std::stoi(ref.metadata().at("trained"));
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  StepContext ctx(*run.strategy, params, *run.kernels, arena, losses,
                  1.0f / static_cast<float>(trained));
  run.model->forward_backward(batch, ctx);
  const double loss = losses.take() * static_cast<double>(rows.inputs.size()) / trained;
  const double want_loss = std::strtod(ref.metadata().at("loss_fp64").c_str(), nullptr);
  const std::string what = name + " LoRA" + (packed ? " packed" : " one example a row");
  CHECK(std::fabs(loss - want_loss) <= 5e-7);
  Worst gw;
  std::size_t adapted = 0;
  for (ParamId p : params.ids()) {
    const ParamSpec& spec = params[p];
    CHECK(spec.trainable == spec.adapter);
    CHECK((ref.find("grad." + spec.name) != nullptr) == spec.adapter);
    if (!spec.adapter) continue;
    ++adapted;
    const std::vector<float> want = tensor(ref, "grad." + spec.name);
    const TensorView g = run.strategy->grad_view(p);
    const std::vector<float> got(g.f32(), g.f32() + g.numel());
    double scale = 0;
    for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    const Worst w = compare(got, want, 2e-6 * scale, 1e-4, what + " gradient of " + spec.name);
    gw.ratio = std::max(gw.ratio, w.ratio);
  }
  const auto in_file = std::count_if(ref.entries().begin(), ref.entries().end(),
                                     [](const auto& e) { return e.name.starts_with("lora."); });
  CHECK(adapted == static_cast<std::size_t>(in_file));
  MESSAGE(what << ": loss error " << std::fabs(loss - want_loss) << ", " << adapted
               << " adapter tensors' gradients within " << gw.ratio << " of their tolerance");
  if (packed) return;
  // The export merges W + scale B A: as a plain model it computes the
  // same loss (PEFT's merged model's, merged_loss_fp64).
  test::TempDir out;
  export_weights(*run.model, *run.strategy, out.path(), DType::f32);
  Run merged = golden_run(out.path(), model_ref, false, rows.rows);
  const auto merged_params = merged.model->params();
  StepContext merged_ctx(*merged.strategy, merged_params, *merged.kernels, arena, losses,
                         1.0f / static_cast<float>(trained));
  merged.model->forward_backward(batch, merged_ctx);
  const double merged_loss = losses.take() * static_cast<double>(rows.inputs.size()) / trained;
  CHECK(std::fabs(merged_loss -
                  std::strtod(ref.metadata().at("merged_loss_fp64").c_str(), nullptr)) <= 5e-7);
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

TEST_CASE("fine-tuning examples, one a row and packed: transformers' masked loss and gradients") {
  for (const char* name : {"llama", "qwen2"})
    for (bool packed : {false, true}) check_sft(name, packed);
}

TEST_CASE(
    "LoRA matches PEFT's in float64: the loss and every adapter's gradient, the base frozen") {
  check_lora("gpt2", false);
  for (const char* name : {"llama", "qwen2"})
    for (bool packed : {false, true}) check_lora(name, packed);
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
