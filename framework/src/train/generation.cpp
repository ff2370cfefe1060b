#include "train/generation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "job/rank_agreement.h"
#include "ztrain/error.h"
#include "ztrain/random.h"

namespace ztrain {
namespace {

// Rank 0's ids on every rank, as the bytes of a text (rank_0_text carries
// them as fp32 bits, which collectives copy untouched).
void share_ids(Communicator& comm, std::vector<std::int32_t>& ids) {
  const std::string bytes(reinterpret_cast<const char*>(ids.data()),
                          ids.size() * sizeof(std::int32_t));
  const std::string got = rank_0_text(comm.rank() == 0 ? bytes : std::string(), comm);
  ids.resize(got.size() / sizeof(std::int32_t));
  if (!got.empty()) std::memcpy(ids.data(), got.data(), got.size());
}

}  // namespace

std::int32_t choose_token(std::vector<float> logits, const GenerationSettings& s,
                          std::uint64_t draw) {
  if (s.temperature <= 0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const std::size_t k = s.top_k > 0 ? std::min<std::size_t>(s.top_k, order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int32_t x, std::int32_t y) { return logits[x] > logits[y]; });
  const double top = logits[order[0]];
  std::vector<double> weight(k);
  double total = 0;
  for (std::size_t i = 0; i < k; ++i)
    total += weight[i] = std::exp((logits[order[i]] - top) / s.temperature);
  double u = uniform_open(draw) * total;
  for (std::size_t i = 0; i < k; ++i)
    if ((u -= weight[i]) <= 0) return order[i];
  return order[k - 1];
}

std::vector<std::int32_t> generate(
    Run& run, Arena& arena, LossSum& losses, std::vector<std::int32_t> ids,
    const GenerationSettings& s,
    const std::function<void(const std::vector<std::int32_t>&)>& on_token) {
  Communicator& comm = *run.comm;
  share_ids(comm, ids);
  const ModelInfo info = run.model->info();
  const auto T = static_cast<std::size_t>(info.seq_len);
  const int V = info.vocab_size;
  for (const std::int32_t id : ids)
    if (id < 0 || id >= V)
      throw DataError("the prompt's token " + std::to_string(id) +
                      " is outside the model's vocabulary (vocab_size " + std::to_string(V) +
                      "): the tokenizer is not the model's");
  if (ids.empty())
    throw ConfigError(
        "nothing to sample from: the prompt is empty and the tokenizer names no document-start "
        "token; give the text to continue ([train] sample_prompt, --prompt)");
  const auto params = run.model->params();
  std::vector<std::int32_t> made, window, targets;
  std::vector<float> logits;
  for (int n = 0; n < s.max_tokens; ++n) {
    const std::size_t len = std::min(ids.size(), T);
    window.assign(ids.end() - static_cast<std::ptrdiff_t>(len), ids.end());
    targets.assign(len, 0);
    logits.resize(len * static_cast<std::size_t>(V));
    {
      StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
      run.model->forward_logits({{1, static_cast<int>(len)}, window.data(), targets.data()}, ctx,
                                logits.data());
      losses.take();
    }
    const auto last = logits.end() - V;
    std::int32_t next =
        choose_token({last, logits.end()}, s, hash_combine(s.seed, static_cast<std::uint64_t>(n)));
    std::vector<std::int32_t> chosen{next};
    share_ids(comm, chosen);
    next = chosen[0];
    if (s.stop && next == *s.stop) break;
    ids.push_back(next);
    made.push_back(next);
    if (on_token) on_token(made);
  }
  return made;
}

}  // namespace ztrain
