// zero2 (ZeRO stage 2): full parameters on every rank; gradients exist whole
// only in bucket buffers while backward fills them, then are
// reduce-scattered so each rank keeps the averaged gradients of its own
// shard, whose optimizer state it holds; the stepped shards are
// all-gathered. 2 psi (N-1)/N elements sent per step; gradients psi/N
// elements plus the buckets in flight.
#include <optional>

#include "ztrain/comm.h"
#include "ztrain/shard/bucket_options.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/strategy.h"

namespace {

using namespace ztrain;

class Zero2 final : public Strategy {
 public:
  explicit Zero2(const Options& o)
      : reduce_(shard::bucket_settings(o, "zero2")), allgather_(shard::allgather_bucket_size(o)) {}
  static void declare_options(OptionList& o) { shard::declare_bucket_options(o, 2); }

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    layout_.emplace(params_, comm_->size());
    begin_ = layout_->owned_begin(comm_->rank());
    const std::uint64_t shard = layout_->owned_end(comm_->rank()) - begin_;
    replica_.emplace(*s.device, params_, *layout_, s.seed, s.precision, std::nullopt);
    grad_dtype_ = s.grad_dtype;
    grads_ = s.device->allocate(Tier::device, Category::grads, shard * dtype_size(grad_dtype_));
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, begin_, begin_ + shard,
                       s.optimizer, replica_->weights().at(begin_));
    reducer_.emplace(*s.device, params_, *layout_, *comm_,
                     shard::make_reduce_plan(params_, *layout_,
                                             shard::ReducePolicy::shard_during_backward, reduce_),
                     grad_dtype_, TypedPtr{}, grad_shard(), "zero2");
  }

  void begin_micro_step(bool last) override { reducer_->begin_micro_step(last); }
  void before_forward(ModuleId) override {}
  void after_forward(ModuleId) override {}
  void before_backward(ModuleId) override {}
  void after_backward(ModuleId m) override { reducer_->module_done(m); }

  TensorView param_view(ParamId p) override { return replica_->param(p); }
  TensorView grad_view(ParamId p) override { return reducer_->grad(p); }
  void read_param(ParamId p, float* out) override { replica_->read(p, out); }
  void write_param(ParamId p, const float* in) override {
    replica_->write(p, in);
    optimizer_->write_master(layout_->offset(p), in, layout_->numel(p));
  }

  StepResult step(const StepArgs& a) override {
    reducer_->finish();
    const StepResult r = shard::step_shard(*optimizer_, replica_->weights().at(begin_),
                                           grad_shard(), comm_, *kernels_, a);
    if (!r.skipped) replica_->publish(*comm_, allgather_);
    return r;
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, a.world);
    const std::uint64_t n = layout.total(), shard = n / static_cast<std::uint64_t>(a.world);
    const auto peaks = shard::worst_reduce_peaks(
        shard::make_reduce_plan(a.params, layout, shard::ReducePolicy::shard_during_backward,
                                reduce_),
        a.world);
    return MemoryEstimate()
        .set(Tier::device, Category::params, n * dtype_size(a.precision))
        .set(Tier::device, Category::grads, (shard + peaks.staged) * dtype_size(a.grad_dtype))
        .set(Tier::device, Category::optimizer,
             shard * shard::optimizer_bytes_per_element(a.precision))
        .set(Tier::device, Category::comm, peaks.recv * dtype_size(a.grad_dtype));
  }

  StrategyStats stats() const override { return {reducer_->wait_seconds()}; }

 private:
  TypedPtr grad_shard() const { return {grads_.data(), grad_dtype_}; }

  std::vector<ParamSpec> params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  shard::ReduceSettings reduce_;
  std::uint64_t allgather_;
  std::optional<shard::FlatLayout> layout_;
  std::uint64_t begin_ = 0;
  std::optional<shard::FullReplica> replica_;
  DType grad_dtype_ = DType::f32;
  Buffer grads_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::GradReducer> reducer_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero2", "0.1.0",
              "ZeRO stage 2: optimizer state and gradients sharded 1/N; gradient buckets "
              "reduce-scattered during backward",
              Zero2)
