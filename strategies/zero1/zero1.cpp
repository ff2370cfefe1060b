// zero1 (ZeRO stage 1): full parameters and gradients on every rank, the
// optimizer state (m, v) sharded 1/N. Gradients are reduce-scattered at the
// end of backward into this rank's shard, the shard is stepped, and the new
// parameters are all-gathered: 2 psi (N-1)/N bytes sent per step, as ddp.
#include <algorithm>
#include <cmath>
#include <optional>

#include "ztrain/comm.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/strategy.h"

namespace {

using namespace ztrain;

class Zero1 final : public Strategy {
 public:
  explicit Zero1(const Options&) {}
  static void declare_options(OptionList&) {}

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    layout_.emplace(params_, comm_->size());
    begin_ = layout_->owned_begin(comm_->rank());
    shard_ = layout_->owned_end(comm_->rank()) - begin_;
    replica_.emplace(*s.device, params_, *layout_, s.seed);
    shard_grads_ = s.device->allocate(Tier::device, Category::grads, shard_ * sizeof(float));
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, begin_, begin_ + shard_,
                       s.optimizer);
  }

  void begin_micro_step(bool) override {}
  void before_forward(ModuleId) override {}
  void after_forward(ModuleId) override {}
  void before_backward(ModuleId) override {}
  void after_backward(ModuleId) override {}

  TensorView param_view(ParamId p) override { return replica_->param(p); }
  TensorView grad_view(ParamId p) override { return replica_->grad(p); }
  void read_param(ParamId p, float* out) override { replica_->read(p, out); }
  void write_param(ParamId p, const float* in) override { replica_->write(p, in); }

  StepResult step(const StepArgs& a) override {
    const std::uint64_t n = layout_->total();
    float* g = shard_grads_.as<float>();
    comm_->reduce_scatter(replica_->grads(), g, shard_, DType::f32, ReduceOp::average);
    std::fill(replica_->grads(), replica_->grads() + n, 0.0f);
    // The global norm: each rank's shard, summed over ranks.
    float sq = static_cast<float>(kernels_->sum_squares(g, shard_));
    comm_->all_reduce(&sq, 1, DType::f32, ReduceOp::sum);
    StepResult r;
    r.grad_norm = std::sqrt(static_cast<double>(sq)) / a.loss_scale;
    r.overflow = !std::isfinite(r.grad_norm);
    r.skipped = r.overflow;
    if (r.skipped) {
      std::fill(g, g + shard_, 0.0f);
    } else {
      const float mult =
          static_cast<float>(1.0 / a.loss_scale) * shard::clip_multiplier(r.grad_norm, a.grad_clip);
      float* w = replica_->weights();
      optimizer_->step(w + begin_, g, *kernels_, a.lr, a.step, mult);
      comm_->all_gather(w + begin_, w, shard_, DType::f32);
    }
    bytes_sent_ += 2 * n * sizeof(float) * static_cast<std::uint64_t>(comm_->size() - 1) /
                   static_cast<std::uint64_t>(comm_->size());
    return r;
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, a.world);
    const std::uint64_t n = layout.total(), shard = n / static_cast<std::uint64_t>(a.world);
    MemoryEstimate e;
    auto& dev = e.bytes[static_cast<std::size_t>(Tier::device)];
    dev[static_cast<std::size_t>(Category::params)] = n * dtype_size(a.precision);
    dev[static_cast<std::size_t>(Category::grads)] = (n + shard) * dtype_size(a.precision);
    dev[static_cast<std::size_t>(Category::optimizer)] = shard * 8;
    return e;
  }

  StrategyStats stats() const override { return {bytes_sent_, 0.0}; }

 private:
  std::vector<ParamSpec> params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  std::optional<shard::FlatLayout> layout_;
  std::uint64_t begin_ = 0, shard_ = 0;
  std::optional<shard::FullReplica> replica_;
  Buffer shard_grads_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::uint64_t bytes_sent_ = 0;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero1", "0.1.0",
              "ZeRO stage 1: optimizer state sharded 1/N; gradients reduce-scattered, "
              "parameters all-gathered after the step",
              Zero1)
