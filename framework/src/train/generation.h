// Text continued from a model's logits, one token at a time: what `ztrain
// sample` prints and what the trainer's [train] sample_every shows.
//
// Each new token comes from the logits at the last position of the ids so
// far, the last seq_len of them run as one sequence that long (only the
// positions that exist are computed): the largest (temperature 0), or drawn
// from softmax(logits / temperature) over the top_k largest (0: all), with
// the draw seeded by (seed, token index), so a seed repeats its text.
//
// Collective: the forward runs through the run's strategy, which may gather
// parameters, so at world > 1 every rank calls generate() with the same
// settings and as many prompt ids; rank 0's ids and choices are broadcast,
// so every rank runs the same forwards and stops at the same token.
//
// Errors: DataError for a prompt id outside the vocabulary; the model's and
// the strategy's errors as they arise. Thread safety: the training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "train/run_assembly.h"

namespace ztrain {

struct GenerationSettings {
  int max_tokens = 64;
  double temperature = 0;  // 0: greedy
  int top_k = 0;           // 0: every token
  std::uint64_t seed = 0;
  std::optional<std::int32_t> stop;  // the token that ends the text (not kept)
};

// The next token from one position's logits (V).
std::int32_t choose_token(std::vector<float> logits, const GenerationSettings& s,
                          std::uint64_t draw);

// The ids made after `prompt` (at least one id; rank 0's count them).
// on_token, where given, sees the ids made so far after each one.
std::vector<std::int32_t> generate(
    Run& run, Arena& arena, LossSum& losses, std::vector<std::int32_t> prompt,
    const GenerationSettings& s,
    const std::function<void(const std::vector<std::int32_t>&)>& on_token = {});

}  // namespace ztrain
