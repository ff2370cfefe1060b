// ddp: every rank holds full parameters, gradients and optimizer state;
// gradients are averaged over ranks in buckets launched as backward
// completes them (overlap_comm), and the optimizer steps the full replica.
#include "ztrain/comm.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/strategy.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

namespace {

using namespace ztrain;

class Ddp final : public Strategy {
 public:
  explicit Ddp(const Options& o)
      : overlap_(o.get_bool("overlap_comm")), bucket_elements_(o.get_int("reduce_bucket_size")) {}
  static void declare_options(OptionList& o) {
    o.flag("overlap_comm", true,
           "reduce gradient buckets while backward runs (false: all at the end of backward)");
    o.integer("reduce_bucket_size", 1000000,
              "elements per gradient bucket (DeepSpeed's meaning; the first bucket holds at "
              "most 256K so communication starts early)")
        .at_least(1);
  }

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    layout_.emplace(params_, 1);
    const std::size_t bytes = layout_->total() * sizeof(float);
    weights_ = s.device->allocate(Tier::device, Category::params, bytes);
    grads_ = s.device->allocate(Tier::device, Category::grads, bytes);
    shard::init_flat(params_, *layout_, s.seed, 0, layout_->total(), weights_.as<float>());
    comm_->broadcast(weights_.data(), layout_->total(), DType::f32, 0);
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, 0, layout_->total(),
                       s.optimizer);
    const std::uint64_t bucket = static_cast<std::uint64_t>(bucket_elements_) * sizeof(float);
    reducer_.emplace(params_, *layout_, grads_.as<float>(), *comm_, bucket,
                     std::min<std::uint64_t>(bucket, 1u << 20));
  }

  void begin_micro_step(bool last) override { reducer_->begin_micro_step(last && overlap_); }
  void before_forward(ModuleId) override {}
  void after_forward(ModuleId) override {}
  void before_backward(ModuleId) override {}
  void after_backward(ModuleId m) override { reducer_->module_done(m); }

  TensorView param_view(ParamId p) override { return view(weights_, p); }
  TensorView grad_view(ParamId p) override { return view(grads_, p); }

  void read_param(ParamId p, float* out) override {
    const float* src = weights_.as<float>() + layout_->offset(p);
    std::copy(src, src + layout_->numel(p), out);
  }
  void write_param(ParamId p, const float* in) override {
    std::copy(in, in + layout_->numel(p), weights_.as<float>() + layout_->offset(p));
  }

  StepResult step(const StepArgs& a) override {
    float* g = grads_.as<float>();
    const std::uint64_t n = layout_->total();
    reducer_->finish();
    StepResult r;
    r.grad_norm = std::sqrt(kernels_->sum_squares(g, n)) / a.loss_scale;
    r.overflow = !std::isfinite(r.grad_norm);
    if (r.overflow) {
      r.skipped = true;
      std::fill(g, g + n, 0.0f);
    } else {
      // The optimizer pass zeroes the gradients for the next step.
      const float mult =
          static_cast<float>(1.0 / a.loss_scale) * shard::clip_multiplier(r.grad_norm, a.grad_clip);
      optimizer_->step(weights_.as<float>(), g, *kernels_, a.lr, a.step, mult);
    }
    return r;
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, 1);
    const std::uint64_t n = layout.total();
    MemoryEstimate e;
    auto& dev = e.bytes[static_cast<std::size_t>(Tier::device)];
    dev[static_cast<std::size_t>(Category::params)] = n * dtype_size(a.precision);
    dev[static_cast<std::size_t>(Category::grads)] = n * dtype_size(a.precision);
    dev[static_cast<std::size_t>(Category::optimizer)] = n * 8;
    return e;
  }

  StrategyStats stats() const override {
    return {reducer_->bytes_sent(), reducer_->wait_seconds()};
  }

 private:
  TensorView view(const Buffer& b, ParamId p) const {
    return {b.as<float>() + layout_->offset(p), DType::f32,
            params_[static_cast<std::size_t>(p)].shape};
  }

  std::vector<ParamSpec> params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  std::optional<shard::FlatLayout> layout_;
  Buffer weights_, grads_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::GradReducer> reducer_;
  bool overlap_;
  std::int64_t bucket_elements_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "ddp", "0.1.0",
              "full replicas; gradients averaged over ranks before the optimizer step", Ddp)
