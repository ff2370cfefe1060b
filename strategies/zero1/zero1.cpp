// zero1 (ZeRO stage 1): full parameters and gradients on every rank, the
// optimizer state (m, v) sharded 1/N. At the end of backward the gradients
// are reduce-scattered in buckets, each rank steps its shard, and the new
// parameters are all-gathered: 2 psi (N-1)/N elements sent per step, as ddp.
#include <algorithm>
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

class Zero1 final : public Strategy {
 public:
  explicit Zero1(const Options& o)
      : reduce_(shard::bucket_settings(o, "zero1")), allgather_(shard::allgather_bucket_size(o)) {}
  static void declare_options(OptionList& o) { shard::declare_bucket_options(o, 1); }

  void setup(const StrategySetup& s) override {
    params_ = s.params;
    comm_ = s.comm;
    kernels_ = s.kernels;
    device_ = s.device;
    layout_.emplace(params_, comm_->size());
    begin_ = layout_->owned_begin(comm_->rank());
    end_ = layout_->owned_end(comm_->rank());
    replica_.emplace(*s.device, params_, *layout_, s.initial_seed(), s.precision, s.grad_dtype);
    optimizer_.emplace(*s.device, Tier::device, params_, *layout_, begin_, end_, s.optimizer,
                       replica_->weights().at(begin_));
    reducer_.emplace(*s.device, params_, *layout_, *comm_,
                     shard::make_reduce_plan(params_, *layout_,
                                             shard::ReducePolicy::shard_after_backward, reduce_),
                     s.grad_dtype, replica_->grads(),
                     std::vector<shard::GradPiece>{{begin_, end_, replica_->grads().at(begin_)}},
                     "zero1");
  }

  void begin_micro_step(bool last) override { reducer_->begin_micro_step(last); }

  // Whole gradients accumulate until the last micro-step's hooks reduce them.
  std::string pipeline_refusal() const override { return {}; }

  TensorView param_view(ParamId p) override { return replica_->param(p); }
  TensorView grad_view(ParamId p) override { return replica_->grad(p); }
  void read_param(ParamId p, float* out) override { replica_->read(p, out); }

  StepResult step(const StepArgs& a) override {
    reducer_->finish();
    const TypedPtr g = replica_->grads();
    // The shard is part of the buffer backward accumulates into: AdamW
    // zeroes it, the rest is zeroed here.
    const StepResult r = shard::step_shard(*optimizer_, replica_->weights().at(begin_),
                                           g.at(begin_), comm_, *kernels_, a, GradAfter::zeroed);
    const std::size_t size = dtype_size(g.dtype);
    device_->fill_zero(g.data, begin_ * size);
    device_->fill_zero(g.at(end_).data, (layout_->total() - end_) * size);
    if (!r.skipped) replica_->publish(*comm_, allgather_);
    return r;
  }

  void save_state(StateSink& sink) override {
    optimizer_->save(sink, *layout_, replica_->weights().at(begin_));
  }
  // The owned range from the checkpoint, the rest of the replica from the
  // other ranks, as after a step.
  void load_state(StateSource& source) override {
    optimizer_->load(source, *layout_, replica_->weights().at(begin_));
    replica_->publish(*comm_, allgather_);
  }

  MemoryEstimate estimate(const EstimateArgs& a) const override {
    const shard::FlatLayout layout(a.params, a.world);
    const std::uint64_t n = layout.total(), shard = n / static_cast<std::uint64_t>(a.world);
    const auto peaks = shard::worst_reduce_peaks(
        shard::make_reduce_plan(a.params, layout, shard::ReducePolicy::shard_after_backward,
                                reduce_),
        a.world);
    return MemoryEstimate()
        .set(Tier::device, Category::params, n * dtype_size(a.precision))
        .set(Tier::device, Category::grads, n * dtype_size(a.grad_dtype))
        .set(Tier::device, Category::optimizer,
             shard * shard::optimizer_bytes_per_element(a.precision))
        .set(Tier::device, Category::comm, peaks.recv * dtype_size(a.grad_dtype));
  }

  StrategyStats stats() const override { return {reducer_->wait_seconds()}; }

 private:
  ParamSpecs params_;
  Communicator* comm_ = nullptr;
  const Kernels* kernels_ = nullptr;
  Device* device_ = nullptr;
  shard::ReduceSettings reduce_;
  std::uint64_t allgather_;
  std::optional<shard::FlatLayout> layout_;
  std::uint64_t begin_ = 0, end_ = 0;
  std::optional<shard::FullReplica> replica_;
  std::optional<shard::OptimizerShard> optimizer_;
  std::optional<shard::GradReducer> reducer_;
};

}  // namespace

ZTRAIN_PLUGIN("strategy", "zero1", "0.2.0",
              "ZeRO stage 1: optimizer state sharded 1/N; gradients reduce-scattered, "
              "parameters all-gathered after the step",
              Zero1)
