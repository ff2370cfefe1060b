// The whole transformer's gradients against finite differences of its
// loss, element by element on a sample spanning every head and row block,
// for both architectures, with and without activation checkpointing; and
// the declared parameter sets against known model sizes. With targets
// masked (kIgnoreTarget), the loss is the mean over the trained ones,
// against per-token cross-entropies computed here from the logits, and
// its gradients against finite differences of it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support.h"
#include "ztrain/model.h"

namespace {

using namespace ztrain;

// extra: more [model] keys (the Llama family's variants).
std::string tiny(const std::string& arch, bool checkpointing, const std::string& extra = "") {
  return "[model]\narch = \"" + arch + "\"\nn_layer = 2\nn_head = 4\n" +
         (arch == "llama" ? "n_kv_head = 2\n" : "") + extra +
         "n_embd = 16\nvocab_size = 29\nseq_len = 7\ninit_std = 0.2\n"
         "activation_checkpointing = " +
         (checkpointing ? "true" : "false") +
         "\n[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = 2\n";
}

struct Fixture {
  Run run;
  ParamSpecs params;
  std::vector<std::int32_t> inputs, targets;
  Batch batch;
  Arena arena;
  LossSum losses;
  double trained = 0;  // targets other than kIgnoreTarget

  // masked: some targets kIgnoreTarget (a prompt of 3 in row 0, every
  // third in row 1).
  explicit Fixture(const std::string& toml, bool masked = false)
      : run(test::make_run(toml)),
        params(run.model->params()),
        arena(*run.device),
        losses(*run.device, *run.kernels) {
    const int B = 2, T = run.model->info().seq_len;
    inputs.resize(static_cast<std::size_t>(B) * T);
    targets.resize(inputs.size());
    for (int b = 0; b < B; ++b)
      run.data->fill(Split::train, static_cast<std::uint64_t>(b), inputs.data() + b * T,
                     targets.data() + b * T);
    if (masked) {
      std::fill_n(targets.begin(), 3, kIgnoreTarget);
      for (int t = 0; t < T; t += 3) targets[static_cast<std::size_t>(T + t)] = kIgnoreTarget;
    }
    batch = {{B, T}, inputs.data(), targets.data()};
    trained = static_cast<double>(
        std::count_if(targets.begin(), targets.end(), [](auto t) { return t != kIgnoreTarget; }));
  }
  // The mean loss over the trained targets (the reported mean is over all
  // N, the ignored ones at 0).
  double loss() {
    StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, token_scale());
    run.model->evaluate(batch, ctx);
    return losses.take() * static_cast<double>(inputs.size()) / trained;
  }
  double forward_backward() {
    StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, token_scale());
    run.model->forward_backward(batch, ctx);
    return losses.take() * static_cast<double>(inputs.size()) / trained;
  }
  float token_scale() const { return static_cast<float>(1.0 / trained); }
  float* param(ParamId p) { return run.strategy->param_view(p).f32(); }
  std::vector<float> grad(ParamId p) {
    const TensorView g = run.strategy->grad_view(p);
    return {g.f32(), g.f32() + g.numel()};
  }
};

// Element-wise finite differences on a sample that spans every head and
// every block of rows: a tensor's rows and columns are cut into blocks of
// the head size (so each head's rows of q, k, v and each head's columns of
// the output projection are blocks of their own), and one element is drawn
// at random in every (row block, column block) cell; vectors are cut the
// same way. Each sampled element's analytic gradient must match the
// fourth-order central difference
//   (8 (L(w+h) - L(w-h)) - (L(w+2h) - L(w-2h))) / 12h
// within kRel of itself plus kAbs: the float32 loss carries rounding of
// about 1e-7 which the difference divides by h; truncation is O(h^4).
// Pinned above the worst samples observed: 0.45 of the tolerance (GPT-2)
// and 0.63 (Llama); a 3% error in one head's slice of one weight's
// gradient reaches 3 to 5 times it.
constexpr double kStep = 2e-2, kRel = 5e-3, kAbs = 2e-5;

struct Sample {
  ParamId param;
  std::size_t index;
};

std::vector<Sample> samples(const ParamSpecs& params, int block, std::mt19937& rng) {
  std::vector<Sample> out;
  for (ParamId p : params.ids()) {
    const Shape& shape = params[p].shape;
    const auto rows = static_cast<std::size_t>(shape[0]);
    const auto cols = shape.rank() > 1 ? static_cast<std::size_t>(shape[1]) : std::size_t{1};
    const auto b = static_cast<std::size_t>(block);
    for (std::size_t r0 = 0; r0 < rows; r0 += b)
      for (std::size_t c0 = 0; c0 < cols; c0 += b) {
        const std::size_t r = r0 + rng() % std::min(b, rows - r0);
        const std::size_t c = c0 + rng() % std::min(b, cols - c0);
        out.push_back({p, r * cols + c});
      }
  }
  return out;
}

void check_model(const std::string& arch, bool checkpointing, const std::string& extra = "",
                 bool masked = false) {
  Fixture f(tiny(arch, checkpointing, extra), masked);
  const double l0 = f.forward_backward();
  CHECK(l0 == doctest::Approx(f.loss()));
  std::mt19937 rng(3);
  const int head_size = 16 / 4;  // tiny(): n_embd / n_head
  double worst = 0;
  std::string worst_at;
  std::size_t count = 0;
  for (const Sample& s : samples(f.params, head_size, rng)) {
    const double analytic = f.grad(s.param)[s.index];
    float* w = f.param(s.param) + s.index;
    const float saved = *w;
    auto at = [&](double delta) {
      *w = static_cast<float>(saved + delta);
      const double l = f.loss();
      *w = saved;
      return l;
    };
    const double fd =
        (8 * (at(kStep) - at(-kStep)) - (at(2 * kStep) - at(-2 * kStep))) / (12 * kStep);
    const double ratio = std::fabs(fd - analytic) / (kRel * std::fabs(analytic) + kAbs);
    const std::string where = f.params[s.param].name + "[" + std::to_string(s.index) + "]";
    INFO(arch << std::string(checkpointing ? " (checkpointing) " : " ") << where << ": analytic "
              << analytic << ", finite difference " << fd);
    CHECK(ratio <= 1.0);
    if (ratio > worst) worst = ratio, worst_at = where;
    ++count;
  }
  MESSAGE(arch << std::string(checkpointing ? " (checkpointing)" : "") << ": " << count
               << " sampled elements, the worst at " << worst << " of its tolerance (" << worst_at
               << ")");
}

}  // namespace

TEST_CASE("gpt2 gradients match finite differences") {
  check_model("gpt2", false);
}
TEST_CASE("gpt2 gradients match finite differences with activation checkpointing") {
  check_model("gpt2", true);
}
TEST_CASE("llama (grouped KV) gradients match finite differences") {
  check_model("llama", false);
}
TEST_CASE("llama gradients match finite differences with activation checkpointing") {
  check_model("llama", true);
}
TEST_CASE("llama gradients match finite differences with checkpoints offloaded to host memory") {
  check_model("llama", true, "offload_checkpoints = true\n");
}

// Every bias a Llama variant may carry, the head tied to the embedding (its
// gradient the sum of both uses) and llama3 RoPE scaling with an original
// context that puts the head's two frequencies in different bands. norm_eps
// 0.01 bounds RMSNorm's curvature: with the default 1e-5 this draw has an
// embedding row of small norm whose fourth-order difference at step 2e-2
// is 15 times the tolerance off (its error falls ten-fold per halved step:
// truncation, not a wrong gradient); with it the worst sample is at 0.75.
constexpr const char* kLlamaVariants =
    "attention_bias = \"all\"\nmlp_bias = true\ntie_embeddings = true\n"
    "rope_scaling = \"llama3\"\nrope_original_max_positions = 16\nrope_theta = 100.0\n"
    "norm_eps = 0.01\n";

TEST_CASE("llama with biases, a tied head and llama3 RoPE: gradients match finite differences") {
  check_model("llama", false, kLlamaVariants);
}
TEST_CASE("llama variants' gradients match finite differences with activation checkpointing") {
  check_model("llama", true, kLlamaVariants);
}

// The head in chunks of 3 tokens (14 in the batch: four whole chunks and a
// partial one), the tied head's gradient summed over chunks and the
// embedding's use.
TEST_CASE("gpt2 and llama gradients match finite differences with the head in chunks") {
  check_model("gpt2", false, "loss_chunk_tokens = 3\n");
  check_model("llama", false, std::string(kLlamaVariants) + "loss_chunk_tokens = 3\n");
}

// Chunked and unchunked runs compute the same gradients with their sums
// in other orders: the head's weight gradient summed chunk by chunk instead
// of over all N rows at once, and whatever order the GEMM library's kernels
// take for each shape (OpenBLAS's differ per CPU family). What holds for
// every order is a bound: a sum of K terms rounded in any order is within
// K u of the sum of its terms' magnitudes (u = 2^-24), and a gradient here
// is reached through the head's sums over V logits and N rows, then per
// layer sums over C channels, H hidden units and T positions. Elementwise
// a cancelling sum has no relative bound, so the bound is normwise: each
// element within K u of the tensor's largest. (Across OpenBLAS's core
// types the worst seen is 5.6e-7 of the largest element, at K u = 1.3e-5
// for gpt2 and 3.6e-5 for llama; a chunk lost or taken twice is off by
// the chunk's whole share.)
double order_tolerance(const Fixture& f) {
  const auto& m = f.run.model->info();
  const int layers = 2, C = 16, H = f.run.model->info().arch == "llama" ? 256 : 64;  // tiny()
  const std::size_t N = f.inputs.size();
  const double K =
      m.vocab_size + static_cast<double>(N) + layers * (C + H + static_cast<double>(m.seq_len));
  return K * 0x1p-24;
}

float widened(const TensorView& g, std::size_t i) {
  return g.dtype == DType::f32 ? g.f32()[i]
                               : bf16_to_float(static_cast<const std::uint16_t*>(g.data)[i]);
}

// Half a bf16 ulp of x: how far rounding x once to bf16 may move it.
double half_bf16_ulp(float x) {
  const int e = std::ilogb(x == 0 ? std::numeric_limits<float>::min() : x);
  return std::ldexp(1.0, e - 8);
}

// b within `tolerance` of a's largest element, plus, for 16-bit tensors,
// the half ulp each was rounded by.
void check_within_order(const TensorView& a, const TensorView& b, double tolerance) {
  const std::size_t n = static_cast<std::size_t>(a.numel());
  double largest = 0;
  for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(double(widened(a, i))));
  const bool rounded = a.dtype != DType::f32;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = widened(a, i), y = widened(b, i);
    const double allowed =
        tolerance * largest + (rounded ? half_bf16_ulp(x) + half_bf16_ulp(y) : 0.0);
    INFO("element " << i << ": " << y << " against " << x << ", allowed " << allowed);
    CHECK(std::fabs(double(y) - x) <= allowed);
  }
}

TEST_CASE("the head in chunks: one chunk's loss and gradients, a 16-bit one rounded once") {
  for (const char* arch : {"gpt2", "llama"})
    for (const char* precision : {"fp32", "bf16"}) {
      INFO(arch << " " << precision);
      const std::string train = std::string("precision = \"") + precision + "\"\n";
      const std::string chunks = "loss_chunk_tokens = 3\n";
      Fixture whole(tiny(arch, false) + train), chunked(tiny(arch, false, chunks) + train);
      CHECK(chunked.forward_backward() == doctest::Approx(whole.forward_backward()).epsilon(1e-6));
      const double tolerance = order_tolerance(whole);
      for (ParamId p : whole.params.ids()) {
        INFO(whole.params[p].name);
        const TensorView a = whole.run.strategy->grad_view(p),
                         b = chunked.run.strategy->grad_view(p);
        REQUIRE(a.dtype == b.dtype);
        check_within_order(a, b, tolerance);
      }
      if (std::string(precision) == "bf16") {
        // The same chunked run with its gradients kept in fp32: its sums
        // are the 16-bit run's before rounding (same weights, same
        // kernels), so each 16-bit gradient is that sum rounded once, bit
        // for bit. Rounded once per chunk, a few hundred elements of the
        // head's would be an ulp off. A tied weight (gpt2's wte) is rounded
        // once per use, as every 16-bit gradient an op adds to: it is held
        // to the bound above; llama's head is untied.
        Fixture sums(tiny(arch, false, chunks) + train + "grad_accum_dtype = \"fp32\"\n");
        sums.forward_backward();
        for (ParamId p : whole.params.ids()) {
          if (whole.params[p].used_by.size() > 1) continue;
          INFO(whole.params[p].name);
          const TensorView g = chunked.run.strategy->grad_view(p),
                           s = sums.run.strategy->grad_view(p);
          REQUIRE(s.dtype == DType::f32);
          const auto* bits = static_cast<const std::uint16_t*>(g.data);
          std::vector<std::uint16_t> once(static_cast<std::size_t>(s.numel()));
          for (std::size_t i = 0; i < once.size(); ++i) once[i] = float_to_bf16(s.f32()[i]);
          CHECK(std::vector<std::uint16_t>(bits, bits + g.numel()) == once);
        }
      }
      // One chunk of (3, V) logits instead of (14, V), and the (V, C) fp32
      // gradient sum beside it (more than it saves at this size).
      auto bytes = [](std::size_t floats) {
        return static_cast<std::int64_t>(Arena::aligned(floats * sizeof(float)));
      };
      const std::size_t V = 29, C = 16, N = 14;
      CHECK(static_cast<std::int64_t>(chunked.run.model->activation_bytes({2, 7})) -
                static_cast<std::int64_t>(whole.run.model->activation_bytes({2, 7})) ==
            bytes(3 * V) + bytes(V * C) - bytes(N * V));
    }
}

TEST_CASE("activation checkpointing gives bit-identical gradients and less activation memory") {
  for (const char* arch : {"gpt2", "llama"}) {
    Fixture plain(tiny(arch, false)), ckpt(tiny(arch, true));
    CHECK(plain.forward_backward() == ckpt.forward_backward());
    for (ParamId p : plain.params.ids()) CHECK(plain.grad(p) == ckpt.grad(p));
    CHECK(ckpt.run.model->activation_bytes({2, 7}) < plain.run.model->activation_bytes({2, 7}));
  }
}

TEST_CASE("parameter declarations: names, tying, decay and the known model sizes") {
  using namespace id_literals;
  auto model_of = [](const std::string& toml) {
    const RunConfig cfg = RunConfig::parse(toml, "m.toml");
    const auto lib = test::loader().load("model", "transformer");
    return lib.create<Model>(cfg.validate("model", lib.options(), {"plugin"}));
  };
  // GPT-2 small (124M) and Llama-2 7B, counted as Hugging Face counts them.
  const auto gpt2 = model_of(
      "[model]\narch=\"gpt2\"\nn_layer=12\nn_head=12\nn_embd=768\nvocab_size=50257\nseq_len="
      "1024\n");
  CHECK(gpt2->info().n_params == 124439808);
  const auto llama = model_of(
      "[model]\narch=\"llama\"\nn_layer=32\nn_head=32\nn_embd=4096\nvocab_size=32000\nseq_len="
      "4096\n");
  CHECK(llama->info().n_params == 6738415616);
  // Llama 3.2 1B (tied head) and Qwen2.5 0.5B (q/k/v biases, tied head).
  const auto llama32 = model_of(
      "[model]\narch=\"llama\"\nn_layer=16\nn_head=32\nn_kv_head=8\nn_embd=2048\n"
      "intermediate_size=8192\nvocab_size=128256\ntie_embeddings=true\n");
  CHECK(llama32->info().n_params == 1235814400);
  const auto qwen = model_of(
      "[model]\narch=\"llama\"\nn_layer=24\nn_head=14\nn_kv_head=2\nn_embd=896\n"
      "intermediate_size=4864\nvocab_size=151936\ntie_embeddings=true\nattention_bias=\"qkv\"\n");
  CHECK(qwen->info().n_params == 494032768);
  const auto qp = qwen->params();
  CHECK(qp[1_param].name == "model.layers.0.input_layernorm.weight");
  CHECK(qp[3_param].name == "model.layers.0.self_attn.q_proj.bias");
  CHECK(qp[0_param].used_by == std::vector<ModuleId>{0_module, 25_module});  // tied
  CHECK(qp.back().name == "model.norm.weight");

  const auto params = gpt2->params();
  CHECK(params[0_param].name == "wte.weight");
  CHECK(params[0_param].used_by == std::vector<ModuleId>{0_module, 13_module});  // tied
  for (const auto& p : params) {
    CHECK(p.decay == (p.shape.rank() >= 2));
    if (p.name.ends_with("c_proj.weight"))
      CHECK(p.init.std == doctest::Approx(0.02 / std::sqrt(24.0)));
  }
  CHECK(gpt2->modules().size() == 14);
  CHECK(gpt2->modules().back().name == "head");
  const auto lp = llama->params();
  CHECK(lp.back().name == "lm_head.weight");
  CHECK(lp.front().used_by == std::vector<ModuleId>{0_module});  // untied
}

TEST_CASE("bad model shapes are config errors naming the key") {
  const auto lib = test::loader().load("model", "transformer");
  auto make = [&](const std::string& toml) {
    const RunConfig cfg = RunConfig::parse(toml, "m.toml");
    return lib.create<Model>(cfg.validate("model", lib.options(), {"plugin"}));
  };
  CHECK(test::message_of<ConfigError>([&] {
          make("[model]\nn_embd = 250\nn_head = 4\n");
        }).find("m.toml:2:1: [model] n_embd (250) must be divisible by n_head (4)") !=
        std::string::npos);
  CHECK(test::message_of<ConfigError>([&] {
          make("[model]\narch=\"gpt2\"\nn_kv_head = 2\n");
        }).find("grouped") != std::string::npos);
  CHECK(test::message_of<ConfigError>([&] {
          make("[model]\narch=\"llama\"\nn_embd = 12\nn_head = 4\n");
        }).find("even head size") != std::string::npos);
  for (const char* key : {"tie_embeddings = false", "rope_scaling = \"linear\"",
                          "attention_bias = \"qkv\"", "mlp_bias = false"})
    CHECK(test::message_of<ConfigError>(
              [&] { make(std::string("[model]\narch=\"gpt2\"\n") + key + "\n"); })
              .find("m.toml:3:1: [model] " +
                    std::string(key).substr(0, std::string(key).find(' ')) +
                    " is a Llama option") != std::string::npos);
  CHECK(test::message_of<ConfigError>([&] {
          make("[model]\narch=\"llama\"\nattention_bias = \"qkv\"\nmlp_bias = true\n");
        }).find("is no Hugging Face model") != std::string::npos);
  CHECK(test::message_of<ConfigError>([&] {
          make("[model]\nrope_scaling = \"llama3\"\nrope_high_freq_factor = 1.0\n");
        }).find("rope_high_freq_factor > rope_low_freq_factor") != std::string::npos);
}

// The masked loss is the mean of the trained tokens' cross-entropies,
// computed here in double from the model's logits; its gradients match
// finite differences of it (a masked token's logits get no gradient).
TEST_CASE("masked targets: the loss is the trained tokens' mean, its gradients match") {
  for (const char* arch : {"gpt2", "llama"}) {
    CAPTURE(arch);
    Fixture f(tiny(arch, false), true);
    const int V = 29;
    std::vector<float> logits(f.inputs.size() * V);
    {
      StepContext ctx(*f.run.strategy, f.params, *f.run.kernels, f.arena, f.losses, 1.0f);
      f.run.model->forward_logits(f.batch, ctx, logits.data());
      f.losses.take();
    }
    double sum = 0;
    for (std::size_t i = 0; i < f.inputs.size(); ++i) {
      if (f.targets[i] == kIgnoreTarget) continue;
      const float* x = logits.data() + i * V;
      double m = x[0], z = 0;
      for (int v = 1; v < V; ++v) m = std::max(m, static_cast<double>(x[v]));
      for (int v = 0; v < V; ++v) z += std::exp(x[v] - m);
      sum += std::log(z) + m - x[f.targets[i]];
    }
    CHECK(f.trained == 14 - 3 - 3);
    CHECK(f.loss() == doctest::Approx(sum / f.trained).epsilon(1e-6));
    check_model(arch, false, "", true);
    check_model(arch, true, "", true);
  }
}

TEST_CASE("a token outside the vocabulary is a data error, not a crash") {
  Fixture f(tiny("gpt2", false));
  f.inputs[3] = 29;
  CHECK(test::message_of<DataError>([&] { f.forward_backward(); }).find("token id 29") !=
        std::string::npos);
}
