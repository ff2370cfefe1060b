// ddp: every rank holds full parameters, gradients and optimizer state;
// gradients are averaged over ranks in buckets launched as backward
// completes them (overlap_comm), and the optimizer steps the full replica.
#include "ztrain/comm.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/strategy.h"

#include <algorithm>
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
    replica_.emplace(*s.device, params_, *layout_, s.seed, s.precision, s.grad_dtype);
    comm_->broadcast(replica_->weights().data, layout_->total(), s.precision, 0);
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, 0, layout_->total(), s.optimizer,
                       replica_->weights());
    const auto bucket = static_cast<std::uint64_t>(bucket_elements_);
    reducer_.emplace(params_, *layout_, replica_->grads(), *comm_, bucket,
                     std::min<std::uint64_t>(bucket, 1u << 18));
  }

  void begin_micro_step(bool last) override { reducer_->begin_micro_step(last && overlap_); }
  void before_forward(ModuleId) override {}
  void after_forward(ModuleId) override {}
  void before_backward(ModuleId) override {}
  void after_backward(ModuleId m) override { reducer_->module_done(m); }

  TensorView param_view(ParamId p) override { return replica_->param(p); }
  TensorView grad_view(ParamId p) override { return replica_->grad(p); }
  void read_param(ParamId p, float* out) override { replica_->read(p, out); }
  void write_param(ParamId p, const float* in) override {
    replica_->write(p, in);
    optimizer_->write_master(layout_->offset(p), in, layout_->numel(p));
  }

  StepResult step(const StepArgs& a) override {
    reducer_->finish();
    return shard::step_shard(*optimizer_, replica_->weights(), replica_->grads(), nullptr,
                             *kernels_, a);
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, 1);
    const std::uint64_t n = layout.total();
    return MemoryEstimate()
        .set(Tier::device, Category::params, n * dtype_size(a.precision))
        .set(Tier::device, Category::grads, n * dtype_size(a.grad_dtype))
        .set(Tier::device, Category::optimizer,
             n * shard::optimizer_bytes_per_element(a.precision));
  }

  StrategyStats stats() const override { return {reducer_->wait_seconds()}; }

 private:
  std::vector<ParamSpec> params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  std::optional<shard::FlatLayout> layout_;
  std::optional<shard::FullReplica> replica_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::GradReducer> reducer_;
  bool overlap_;
  std::int64_t bucket_elements_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "ddp", "0.1.0",
              "full replicas; gradients averaged over ranks before the optimizer step", Ddp)
