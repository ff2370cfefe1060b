#include "train/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ztrain/error.h"

namespace ztrain {

LossScaler::LossScaler(const LossScalerSettings& s)
    : dynamic_(s.loss_scale == 0),
      scale_(s.loss_scale == 0 ? std::ldexp(1.0, static_cast<int>(s.initial_scale_power))
                               : s.loss_scale),
      min_scale_(s.min_loss_scale),
      window_(s.loss_scale_window),
      delayed_shift_(s.hysteresis),
      hysteresis_(s.hysteresis),
      consecutive_(s.consecutive_hysteresis) {}

double LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++iter_;
    return scale_;
  }
  if (overflow) {
    if (delayed_shift_ == 1 || hysteresis_ == 1) {
      if (scale_ == min_scale_)
        throw NumericsError(
            "the gradients overflowed at the minimum loss scale " + std::to_string(scale_) +
            " (step " + std::to_string(iter_ + 1) +
            "); the run cannot go on in fp16: lower [train] lr, set grad_clip, lower "
            "[train.fp16] min_loss_scale, or train in bf16");
      scale_ = std::max(scale_ / 2, min_scale_);
    } else {
      --hysteresis_;
    }
    last_overflow_ = iter_;
  } else {
    if (consecutive_) hysteresis_ = delayed_shift_;
    if ((iter_ - last_overflow_) % window_ == 0) {
      if (!consecutive_) hysteresis_ = delayed_shift_;
      scale_ *= 2;
    }
  }
  ++iter_;
  return scale_;
}

}  // namespace ztrain
