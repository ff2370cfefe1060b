// LossScaler: the loss scale of fp16 training, with DeepSpeed's semantics.
//
// Static (loss_scale > 0): the scale never changes; an overflow still skips
// the step. Dynamic (loss_scale = 0): the scale starts at
// 2^initial_scale_power. An overflowing step is skipped; it halves the
// scale only when the hysteresis counter is down to one (else it counts the
// counter down), never below min_loss_scale, and an overflow that would
// halve a scale already at min_loss_scale stops the run. After
// loss_scale_window steps without an overflow (counted from the last one)
// the scale doubles and the counter refills; with consecutive_hysteresis
// every clean step refills it. bf16 and fp32 use a static scale of 1, as
// DeepSpeed does.
//
// Errors: update() raises NumericsError at the minimum scale.
// Thread safety: none; the training thread owns it.
#pragma once

#include <cstdint>

#include "checkpoint/manifest.h"
#include "config/run_settings.h"

namespace ztrain {

// What a checkpoint keeps of a scaler, to continue as if never stopped.
class LossScaler {
 public:
  explicit LossScaler(const LossScalerSettings& s);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  std::int64_t hysteresis_left() const { return hysteresis_; }

  // After an optimizer step whose gradients did (overflow) or did not
  // overflow; returns the scale for the next step.
  double update(bool overflow);

  LossScalerState state() const { return {scale_, hysteresis_, iter_, last_overflow_}; }
  void restore(const LossScalerState& s) {
    scale_ = s.scale;
    hysteresis_ = s.hysteresis;
    iter_ = s.iter;
    last_overflow_ = s.last_overflow;
  }

 private:
  bool dynamic_;
  double scale_, min_scale_;
  std::int64_t window_, delayed_shift_, hysteresis_;
  bool consecutive_;
  std::int64_t iter_ = 0, last_overflow_ = -1;
};

}  // namespace ztrain
