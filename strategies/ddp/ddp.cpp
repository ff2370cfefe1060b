// ddp: every rank holds full parameters, gradients and optimizer state;
// gradients are averaged over ranks in buckets launched as backward
// completes them (overlap_comm), and the optimizer steps the full replica.
#include "ztrain/comm.h"
#include "ztrain/shard/bucket_options.h"
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
  explicit Ddp(const Options& o) : reduce_(shard::bucket_settings(o, "ddp")) {}
  static void declare_options(OptionList& o) { shard::declare_bucket_options(o, 0); }

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    layout_.emplace(params_, 1);
    replica_.emplace(*s.device, params_, *layout_, s.initial_seed(), s.precision, s.grad_dtype);
    comm_->broadcast(replica_->weights().data, layout_->total(), s.precision, 0);
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, 0, layout_->total(), s.optimizer,
                       replica_->weights());
    reducer_.emplace(
        *s.device, params_, *layout_, *comm_,
        shard::make_reduce_plan(params_, *layout_, shard::ReducePolicy::replicate, reduce_),
        s.grad_dtype, replica_->grads(), std::vector<shard::GradPiece>{}, "ddp");
  }

  void begin_micro_step(bool last) override { reducer_->begin_micro_step(last); }
  void after_backward(ModuleId m) override { reducer_->module_done(m); }

  // Whole gradients accumulate until the last micro-step's hooks reduce them.
  std::string pipeline_refusal() const override { return {}; }

  TensorView param_view(ParamId p) override { return replica_->param(p); }
  TensorView grad_view(ParamId p) override { return replica_->grad(p); }
  void read_param(ParamId p, float* out) override { replica_->read(p, out); }

  StepResult step(const StepArgs& a) override {
    reducer_->finish();
    // Backward accumulates into these gradients: AdamW leaves them zero.
    return shard::step_shard(*optimizer_, replica_->weights(), replica_->grads(), nullptr,
                             *kernels_, a, GradAfter::zeroed);
  }

  // Every rank holds the whole state: rank r saves the r-th of world equal
  // parts, so all ranks write at once; a load reads everything.
  void save_state(StateSink& sink) override {
    const std::uint64_t n = layout_->total(), world = static_cast<std::uint64_t>(comm_->size()),
                        r = static_cast<std::uint64_t>(comm_->rank());
    optimizer_->save(sink, *layout_, replica_->weights(), n * r / world, n * (r + 1) / world);
  }
  void load_state(StateSource& source) override {
    optimizer_->load(source, *layout_, replica_->weights());
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
  ParamSpecs params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  std::optional<shard::FlatLayout> layout_;
  std::optional<shard::FullReplica> replica_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::GradReducer> reducer_;
  shard::ReduceSettings reduce_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "ddp", "0.1.0",
              "full replicas; gradients averaged over ranks before the optimizer step", Ddp)
