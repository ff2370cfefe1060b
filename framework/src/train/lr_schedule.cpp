#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ztrain {

double LrSchedule::at(std::int64_t step) const {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == "constant") return lr;
  const std::int64_t span = std::max<std::int64_t>(1, total - warmup - 1);
  const double ratio =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(span), 0.0, 1.0);
  if (kind == "linear") return lr - ratio * (lr - min_lr);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
}

}  // namespace ztrain
