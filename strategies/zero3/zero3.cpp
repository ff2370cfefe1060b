// zero3 (ZeRO stage 3): parameters, gradients and optimizer state all
// sharded 1/N. Each module's parameters are all-gathered before it runs
// (prefetched along the first step's trace) and released after; gradients
// are reduce-scattered in buckets during backward as in zero2; the optimizer
// steps the shard in place. 3 psi (N-1)/N elements sent per step: parameters
// gathered for forward and again for backward, gradients reduce-scattered.
#include <algorithm>
#include <optional>

#include "ztrain/comm.h"
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/strategy.h"

namespace {

using namespace ztrain;

class Zero3 final : public Strategy {
 public:
  explicit Zero3(const Options& o)
      : reduce_(shard::bucket_settings(o, "zero3")), gather_(shard::gather_options(o)) {}
  static void declare_options(OptionList& o) {
    shard::declare_bucket_options(o, 3);
    shard::declare_gather_options(o);
  }

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    layout_.emplace(params_, comm_->size());
    const std::uint64_t begin = layout_->owned_begin(comm_->rank());
    shard_ = layout_->owned_end(comm_->rank()) - begin;
    precision_ = s.precision;
    grad_dtype_ = s.grad_dtype;
    weights_ = s.device->allocate(Tier::device, Category::params, shard_ * dtype_size(precision_));
    shard::init_flat(params_, *layout_, s.seed, begin, begin + shard_, weight_shard());
    grads_ = s.device->allocate(Tier::device, Category::grads, shard_ * dtype_size(grad_dtype_));
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, begin, begin + shard_,
                       s.optimizer, weight_shard());
    gatherer_.emplace(*s.device, params_, s.modules, *layout_, *comm_, weight_shard(), gather_,
                      "zero3");
    reducer_.emplace(*s.device, params_, *layout_, *comm_,
                     shard::make_reduce_plan(params_, *layout_,
                                             shard::ReducePolicy::shard_during_backward, reduce_),
                     grad_dtype_, TypedPtr{}, grad_shard(), "zero3");
  }

  void begin_micro_step(bool last) override {
    gatherer_->begin_micro_step();
    reducer_->begin_micro_step(last);
  }
  void before_forward(ModuleId m) override { gatherer_->fetch(m, false); }
  void after_forward(ModuleId m) override { gatherer_->release(m, false); }
  void before_backward(ModuleId m) override { gatherer_->fetch(m, true); }
  void after_backward(ModuleId m) override {
    gatherer_->release(m, true);
    reducer_->module_done(m);
  }

  TensorView param_view(ParamId p) override { return gatherer_->view(p); }
  TensorView grad_view(ParamId p) override { return reducer_->grad(p); }
  void read_param(ParamId p, float* out) override { gatherer_->read(p, out); }
  void write_param(ParamId p, const float* in) override {
    gatherer_->write(p, in);
    optimizer_->write_master(layout_->offset(p), in, layout_->numel(p));
  }

  StepResult step(const StepArgs& a) override {
    gatherer_->end_step();
    reducer_->finish();
    const StepResult r =
        shard::step_shard(*optimizer_, weight_shard(), grad_shard(), comm_, *kernels_, a);
    if (!r.skipped) gatherer_->refresh();
    return r;
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, a.world);
    const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(a.world);
    const auto peaks = shard::worst_reduce_peaks(
        shard::make_reduce_plan(a.params, layout, shard::ReducePolicy::shard_during_backward,
                                reduce_),
        a.world);
    const auto gathered = shard::estimate_gather_peaks(a.params, gather_);
    return MemoryEstimate()
        .set(Tier::device, Category::params,
             (shard + gathered.persistent + gathered.live) * dtype_size(a.precision))
        .set(Tier::device, Category::grads, (shard + peaks.staged) * dtype_size(a.grad_dtype))
        .set(Tier::device, Category::optimizer,
             shard * shard::optimizer_bytes_per_element(a.precision))
        .set(Tier::device, Category::comm,
             std::max(peaks.recv * dtype_size(a.grad_dtype),
                      gathered.packed * dtype_size(a.precision)));
  }

  StrategyStats stats() const override {
    return {reducer_->wait_seconds() + gatherer_->wait_seconds()};
  }

 private:
  TypedPtr weight_shard() const { return {weights_.data(), precision_}; }
  TypedPtr grad_shard() const { return {grads_.data(), grad_dtype_}; }

  std::vector<ParamSpec> params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  shard::ReduceSettings reduce_;
  shard::GatherOptions gather_;
  std::optional<shard::FlatLayout> layout_;
  std::uint64_t shard_ = 0;
  DType precision_ = DType::f32, grad_dtype_ = DType::f32;
  Buffer weights_, grads_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::ParamGatherer> gatherer_;
  std::optional<shard::GradReducer> reducer_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero3", "0.1.0",
              "ZeRO stage 3: parameters, gradients and optimizer state sharded 1/N; each "
              "module's parameters gathered before use and released after",
              Zero3)
