#include "commands/sample.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "checkpoint/hf_export.h"
#include "config/hf_model_import.h"
#include "text/tokenizer.h"
#include "train/run_assembly.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace ztrain {
namespace {

namespace fs = std::filesystem;

std::optional<std::int32_t> token_id_of(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int32_t>();
}

// The next token from one position's logits (V).
std::int32_t choose(std::vector<float> logits, const SampleArgs& a, std::uint64_t draw) {
  if (a.temperature <= 0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const std::size_t k = a.top_k > 0 ? std::min<std::size_t>(a.top_k, order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int32_t x, std::int32_t y) { return logits[x] > logits[y]; });
  const double top = logits[order[0]];
  std::vector<double> weight(k);
  double total = 0;
  for (std::size_t i = 0; i < k; ++i)
    total += weight[i] = std::exp((logits[order[i]] - top) / a.temperature);
  double u = uniform_open(draw) * total;
  for (std::size_t i = 0; i < k; ++i)
    if ((u -= weight[i]) <= 0) return order[i];
  return order[k - 1];
}

}  // namespace

std::vector<std::int32_t> sample(const SampleArgs& a, const PluginLoader& loader,
                                 std::ostream& out) {
  if (a.max_tokens < 1)
    throw ConfigError("--max-tokens " + std::to_string(a.max_tokens) + ": give 1 or more");
  if (a.temperature < 0 || !std::isfinite(a.temperature))
    throw ConfigError("--temperature must be 0 (greedy) or more");
  const fs::path tok_file = a.tokenizer.empty() ? tokenizer_in(a.dir) : a.tokenizer;
  if (tok_file.empty() || !fs::exists(tok_file))
    throw ConfigError(
        "no tokenizer " +
        (tok_file.empty() ? "in '" + a.dir.string() + "'" : "at '" + tok_file.string() + "'") +
        "; give one with --tokenizer tokenizer.json");
  const auto tok = text::load_tokenizer(tok_file);
  std::ifstream cfg_in(a.dir / "config.json");
  const auto config = nlohmann::json::parse(cfg_in, nullptr, false);
  RunConfig run_config = RunConfig::parse(
      "[model]\nfrom = " + nlohmann::json(a.dir.string()).dump() +
          "\n[data]\nplugin = \"synthetic\"\n[train]\nmicro_batch_size = 1\nsave_final = false\n",
      "ztrain sample");
  resolve_model_dir(run_config);
  Run run = assemble(run_config, loader);
  const ModelInfo info = run.model->info();
  const int T = info.seq_len, V = info.vocab_size;

  std::vector<std::int32_t> ids;
  if (const auto bos = token_id_of(config, "bos_token_id")) ids.push_back(*bos);
  for (const std::int32_t id : tok->encode(a.prompt)) {
    if (id >= V)
      throw DataError("the prompt's token " + std::to_string(id) +
                      " is past the model's vocab_size " + std::to_string(V) +
                      ": the tokenizer is not the model's");
    ids.push_back(id);
  }
  if (ids.empty()) throw ConfigError("--prompt is empty; give the text to continue");
  const auto eos = token_id_of(config, "eos_token_id");
  out << a.prompt << std::flush;
  const auto params = run.model->params();
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  std::vector<std::int32_t> window(static_cast<std::size_t>(T)), targets(window.size(), 0);
  std::vector<float> logits(static_cast<std::size_t>(T) * V);
  std::vector<std::int32_t> made;
  std::string shown;
  for (int n = 0; n < a.max_tokens; ++n) {
    // The last T tokens, padded after them (causal: the padding is unseen).
    const std::size_t len = std::min<std::size_t>(ids.size(), static_cast<std::size_t>(T));
    std::fill(window.begin(), window.end(), 0);
    std::copy(ids.end() - static_cast<std::ptrdiff_t>(len), ids.end(), window.begin());
    StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
    run.model->forward_logits({{1, T}, window.data(), targets.data()}, ctx, logits.data());
    losses.take();
    const auto at =
        logits.begin() + static_cast<std::ptrdiff_t>((len - 1) * static_cast<std::size_t>(V));
    const std::int32_t next =
        choose({at, at + V}, a, hash_combine(a.seed, static_cast<std::uint64_t>(n)));
    if (eos && next == *eos) break;
    ids.push_back(next);
    made.push_back(next);
    // Print what the text gained, once it is whole characters.
    const std::string text = tok->decode(made);
    if (text.rfind(shown, 0) == 0 && text.find("\xEF\xBF\xBD", shown.size()) == std::string::npos) {
      out << text.substr(shown.size()) << std::flush;
      shown = text;
    }
  }
  const std::string text = tok->decode(made);
  if (text.rfind(shown, 0) == 0) out << text.substr(shown.size());
  out << "\n";
  return made;
}

}  // namespace ztrain
