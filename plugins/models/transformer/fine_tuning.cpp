// Fine-tuning methods of the transformer, as LLaMA-Factory (and PEFT)
// define them: which parameters train, the LoRA adapters beside the frozen
// projections, and their forward and backward.
//
// LoRA (Hu et al. 2021; PEFT's Linear): a targeted projection y = x W^T + b
// gains scale * (x A^T) B^T, A (r, in) drawn as PEFT's kaiming_uniform(a =
// sqrt(5)), U(-1/sqrt(in), 1/sqrt(in)), B (out, r) zero, so training starts
// from the base model's function; scale = lora_alpha / r. W and every other
// base parameter are frozen (no gradient, no optimizer state; the host
// holds them, train/frozen_split.h). The adapters are declared after the
// base parameters, so the base keeps its ids, and with them its seeded
// values. Shapes: N tokens, C in, OC out, r rank.
//
//   forward   u = scale * x A^T          (N, r), kept for backward
//             y += u B^T                  (N, OC)
//   backward  dB += dy^T u                (OC, r)
//             du = scale * dy B           (N, r)
//             dA += du^T x                (r, C)
//             dx += du A                  (N, C)
//
// Under tensor parallelism the adapters are cut with their projection: a
// column-parallel one (q, k, v, c_attn, gate, up, c_fc: its output cut)
// keeps A whole on every rank and cuts B's rows as its own; a row-parallel
// one (o, down, the c_proj layers: its input cut) cuts A's columns and
// keeps B whole. Column-parallel, u is the same on every rank and each
// adds its rows of the output; backward, du = dy_part B_part is this
// rank's share: dx takes it (the group sums dx after), dA the sum over
// the group (A is shared, so every rank must have the whole gradient).
// Row-parallel, u = x_part A_part^T is a share, summed over the group
// before B; the group's first rank alone adds u B^T (the projection's sum
// adds it once, as its bias); backward, dy is whole on every rank, so is
// du, and each rank's dx and dA are its own columns'.
//
// Freeze (LLaMA-Factory's _setup_freeze_tuning): the parameters whose
// Hugging Face name contains ".<i>.<module>" for a trainable block i and a
// trainable module, or an extra module's name, train; the rest are frozen.
// The matching is LLaMA-Factory's substring test, so a name means here
// what it means there (freeze_extra_modules = "norm" also reaches the
// blocks' norms, as it does there).
#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "transformer.h"
#include "ztrain/error.h"

namespace ztrain::transformer {
namespace {

std::vector<std::string> names_or_all(const Options& o, const char* key) {
  return o.has_value(key) ? o.get_names(key) : std::vector<std::string>{"all"};
}

std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

constexpr const char* kLoraKeys[] = {"lora_rank", "lora_alpha", "lora_dropout", "lora_target",
                                     "use_rslora"};
constexpr const char* kFreezeKeys[] = {"freeze_trainable_layers", "freeze_trainable_modules",
                                       "freeze_extra_modules"};

}  // namespace

std::string Transformer::module_name(const std::string& param) {
  const std::size_t last = param.rfind('.');
  const std::size_t before = param.rfind('.', last - 1);
  return param.substr(before + 1, last - before - 1);
}

void Transformer::read_fine_tuning(const Options& o) {
  FineTuning& t = cfg_.tuning;
  const std::string method = o.get_string("finetuning_type");
  t.method = method == "lora"     ? FineTuning::Method::lora
             : method == "freeze" ? FineTuning::Method::freeze
                                  : FineTuning::Method::full;
  const auto refuse_unless = [&](const auto& keys, FineTuning::Method m, const char* name) {
    for (const char* key : keys)
      if (o.given(key) && t.method != m)
        throw ConfigError(o.where(key) + ": [model] " + key + " is a key of finetuning_type = \"" +
                          name + "\", but finetuning_type is \"" + method +
                          "\"; set finetuning_type = \"" + name + "\" or remove " + key);
  };
  refuse_unless(kLoraKeys, FineTuning::Method::lora, "lora");
  refuse_unless(kFreezeKeys, FineTuning::Method::freeze, "freeze");
  if (o.get_number("lora_dropout") != 0)
    throw ConfigError(o.where("lora_dropout") +
                      ": [model] lora_dropout: ztrain's LoRA has no dropout (its runs reproduce "
                      "each other exactly under every strategy); set lora_dropout = 0");
  t.lora_rank = static_cast<int>(o.get_int("lora_rank"));
  t.lora_alpha = o.get_number("lora_alpha") > 0 ? o.get_number("lora_alpha") : 2.0 * t.lora_rank;
  t.lora_target = names_or_all(o, "lora_target");
  t.use_rslora = o.get_bool("use_rslora");
  t.freeze_trainable_layers = static_cast<int>(o.get_int("freeze_trainable_layers"));
  t.freeze_trainable_modules = names_or_all(o, "freeze_trainable_modules");
  if (o.has_value("freeze_extra_modules"))
    t.freeze_extra_modules = o.get_names("freeze_extra_modules");
}

void Transformer::declare_adapters(const Options& o) {
  const FineTuning& t = cfg_.tuning;
  if (t.method != FineTuning::Method::lora) return;
  const bool all =
      std::find(t.lora_target.begin(), t.lora_target.end(), "all") != t.lora_target.end();
  std::set<std::string> known;
  for (auto& b : blocks_) {
    const auto weights = b.projections();
    for (std::size_t j = 0; j < kProjCount; ++j) {
      const std::optional<ParamId> w = weights[j];
      if (!w) continue;
      const ParamSpec base = params_[*w];
      const std::string module = module_name(base.name);
      known.insert(module);
      if (!all &&
          std::find(t.lora_target.begin(), t.lora_target.end(), module) == t.lora_target.end())
        continue;
      const std::string stem =
          base.name.substr(0, base.name.size() - std::string(".weight").size());
      // The part's shapes; A's bound is the whole projection's fan-in.
      const std::int64_t out = base.shape[0], in = base.shape[1];
      const TensorSplit& cut = base.split;
      const double fan_in = static_cast<double>(cut.dim == 1 ? cut.whole_extent(in) : in);
      const Init a_init{Init::Kind::uniform, static_cast<float>(1.0 / std::sqrt(fan_in))};
      const ParamId a = add(stem + ".lora_A.weight", {t.lora_rank, in}, a_init, base.used_by,
                            cut.dim == 1 ? cut : TensorSplit{});
      const ParamId bb = add(stem + ".lora_B.weight", {out, t.lora_rank}, {}, base.used_by,
                             cut.dim == 0 ? cut : TensorSplit{});
      for (ParamId id : {a, bb}) params_[id].adapter = true;
      b.lora[j] = BlockParams::Adapter{a, bb};
    }
  }
  for (const std::string& name : t.lora_target)
    if (name != "all" && !known.contains(name))
      throw ConfigError(o.where("lora_target") + ": [model] lora_target: '" + name +
                        "' is no projection of " + (cfg_.llama ? "Llama" : "GPT-2") +
                        "'s blocks; they are " + joined(known) + " (or all)");
  for (ParamSpec& p : params_) p.trainable = p.adapter;
}

std::string Transformer::lora_split_refusal(int degree) const {
  if (cfg_.n_kv_head >= degree) return {};
  for (const BlockParams& b : blocks_)
    for (Proj j : {Proj::k, Proj::v})
      if (b.adapter(j))
        return "[model] lora_target adapts k_proj and v_proj, whose " +
               std::to_string(cfg_.n_kv_head) + " key/value heads are copied over " +
               std::to_string(degree) +
               " tensor-parallel ranks; adapters on copied heads are not built yet: leave "
               "k_proj and v_proj out of lora_target, or choose a degree of at most n_kv_head";
  return {};
}

void Transformer::freeze_params(const Options& o) {
  const FineTuning& t = cfg_.tuning;
  if (t.method != FineTuning::Method::freeze) return;
  const int L = cfg_.n_layer, n = t.freeze_trainable_layers;
  std::vector<int> layers;
  for (int i = n > 0 ? std::max(0, L - n) : 0; i < (n > 0 ? L : std::min(-n, L)); ++i)
    layers.push_back(i);
  // The modules inside blocks and outside them, as LLaMA-Factory lists
  // them: the name's part after ".0." up to the next dot; the second-last
  // part of a name outside the blocks.
  std::set<std::string> hidden, outer;
  const std::regex block(R"(\.\d+\.)");
  const auto external = [](const ParamSpec& p) { return p.hf_name.empty() ? p.name : p.hf_name; };
  for (const ParamSpec& p : params_) {
    const std::string name = external(p);
    if (const std::size_t at = name.find(".0."); at != std::string::npos)
      hidden.insert(name.substr(at + 3, name.find('.', at + 3) - at - 3));
    if (!std::regex_search(name, block)) outer.insert(module_name(name));
  }
  std::vector<std::string> trainable;
  for (const std::string& m : t.freeze_trainable_modules) {
    if (m != "all" && !hidden.contains(m))
      throw ConfigError(o.where("freeze_trainable_modules") + ": [model] '" + m +
                        "' is no module of the blocks; they are " + joined(hidden) + " (or all)");
    for (int i : layers) trainable.push_back("." + std::to_string(i) + "." + (m == "all" ? "" : m));
  }
  for (const std::string& m : t.freeze_extra_modules) {
    if (!outer.contains(m))
      throw ConfigError(o.where("freeze_extra_modules") + ": [model] '" + m +
                        "' is no module outside the blocks; they are " + joined(outer));
    trainable.push_back(m);
  }
  for (ParamSpec& p : params_) {
    const std::string name = external(p);
    p.trainable = std::any_of(trainable.begin(), trainable.end(), [&](const std::string& s) {
      return name.find(s) != std::string::npos;
    });
  }
}

std::vector<AdapterOf> Transformer::adapters() const {
  std::vector<AdapterOf> out;
  for (const BlockParams& b : blocks_) {
    const auto weights = b.projections();
    for (std::size_t j = 0; j < kProjCount; ++j)
      if (b.lora[j])
        out.push_back({*weights[j], b.lora[j]->a, b.lora[j]->b, cfg_.tuning.lora_scale()});
  }
  return out;
}

// PEFT's LoraConfig as save_pretrained writes it; GPT-2's Conv1D layers
// need fan_in_fan_out for PEFT to transpose the update.
std::string Transformer::adapter_config_json() const {
  const FineTuning& t = cfg_.tuning;
  if (t.method != FineTuning::Method::lora) return {};
  std::set<std::string> targets;
  for (const AdapterOf& a : adapters()) targets.insert(module_name(params_[a.weight].name));
  std::string list;
  for (const std::string& m : targets) list += (list.empty() ? "\"" : ", \"") + m + "\"";
  return std::string("{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n") +
         "  \"r\": " + std::to_string(t.lora_rank) +
         ",\n  \"lora_alpha\": " + json_number(t.lora_alpha) +
         ",\n  \"lora_dropout\": 0.0,\n  \"target_modules\": [" + list +
         "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": " + (cfg_.llama ? "false" : "true") +
         ",\n  \"use_rslora\": " + (t.use_rslora ? "true" : "false") +
         ",\n  \"use_dora\": false,\n  \"modules_to_save\": null,\n"
         "  \"inference_mode\": true\n}\n";
}

namespace {

// The input is cut where the projection is row-parallel (its output is
// summed over the tensor group after it).
bool row_parallel(Proj j) {
  return j == Proj::o || j == Proj::down;
}

}  // namespace

void Transformer::lora_forward(int l, Linear lin, float* out, BlockActs& b, const Acts& a,
                               StepContext& ctx) const {
  const auto adapter = blocks_[static_cast<std::size_t>(l)].adapter(lin.proj);
  if (!adapter) return;
  const Kernels& k = ctx.kernels();
  const std::size_t N = lin.shape.N, r = static_cast<std::size_t>(cfg_.tuning.lora_rank);
  float* u = b.lora_u[static_cast<std::size_t>(lin.proj)];
  const bool row = cfg_.tensor > 1 && row_parallel(lin.proj);
  k.matmul_forward(u, lin.x, ConstTypedPtr(param(ctx, adapter->a)), nullptr, {N, lin.shape.C, r});
  if (row) tensor_sum(ctx, u, N * r);
  k.scale(u, cfg_.tuning.lora_scale(), N * r);
  if (row && cfg_.tensor_rank != 0) return;
  k.matmul_forward(a.lora_out, u, ConstTypedPtr(param(ctx, adapter->b)), nullptr,
                   {N, r, lin.shape.OC});
  k.add(out, out, a.lora_out, N * lin.shape.OC);
}

void Transformer::lora_backward(int l, Linear lin, float* dx, const float* dout, const BlockActs& b,
                                const Acts& a, StepContext& ctx) const {
  const auto adapter = blocks_[static_cast<std::size_t>(l)].adapter(lin.proj);
  if (!adapter) return;
  const Kernels& k = ctx.kernels();
  const std::size_t N = lin.shape.N, r = static_cast<std::size_t>(cfg_.tuning.lora_rank);
  const float* u = b.lora_u[static_cast<std::size_t>(lin.proj)];
  ctx.activations().device().fill_zero(a.lora_du, N * r * sizeof(float));
  k.matmul_backward(a.lora_du, TypedPtr(grad(ctx, adapter->b)), nullptr, dout, u,
                    ConstTypedPtr(param(ctx, adapter->b)), {N, r, lin.shape.OC});
  k.scale(a.lora_du, cfg_.tuning.lora_scale(), N * r);
  const ConstTypedPtr A = param(ctx, adapter->a);
  const MatmulShape shape{N, lin.shape.C, r};
  if (cfg_.tensor <= 1 || row_parallel(lin.proj))
    return k.matmul_backward(dx, TypedPtr(grad(ctx, adapter->a)), nullptr, a.lora_du, lin.x, A,
                             shape);
  k.matmul_backward(dx, nullptr, nullptr, a.lora_du, lin.x, A, shape);  // this rank's share
  tensor_sum(ctx, a.lora_du, N * r);
  k.matmul_backward(nullptr, TypedPtr(grad(ctx, adapter->a)), nullptr, a.lora_du, lin.x, A, shape);
}

}  // namespace ztrain::transformer
