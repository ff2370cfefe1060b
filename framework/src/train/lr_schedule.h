// The learning-rate schedule: linear warmup from lr/warmup to lr over
// `warmup_steps`, then cosine, linear or constant decay to min_lr at the last
// step (nanoGPT's and llm.c's convention: step s of warmup uses
// lr * (s+1) / warmup).
#pragma once

#include <cstdint>
#include <string>

namespace ztrain {

struct LrSchedule {
  double lr = 0, min_lr = 0;
  std::int64_t warmup = 0, total = 0;
  std::string kind = "cosine";

  // step: 0-based optimizer step.
  double at(std::int64_t step) const;
};

}  // namespace ztrain
