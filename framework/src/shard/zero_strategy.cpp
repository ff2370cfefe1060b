#include "ztrain/shard/zero_strategy.h"

#include <algorithm>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {
namespace {

// Plans with buckets outside staging buffers reduce from a whole gradient
// buffer of the caller's.
bool needs_full_grads(const ReducePlan& plan) {
  return std::any_of(plan.buckets.begin(), plan.buckets.end(),
                     [](const ReduceBucket& b) { return !b.staged; });
}

// sub_group_size as asked, and as rounded where that differs.
std::string sub_groups(std::uint64_t asked) {
  const std::uint64_t n = SwappedOptimizer::sub_group_elements(asked);
  return std::to_string(asked) + (n == asked ? "" : " (" + std::to_string(n) + ": whole pages)");
}

// What a design offloads, and its note: the run header and the estimate.
std::string describe(const ZeroDesign& d) {
  std::string s;
  const auto percent = [](double r) {
    return std::to_string(static_cast<int>(r * 100 + 0.5)) + "%";
  };
  if (d.shard_params && d.param_tier == Tier::nvme)
    s += "parameter shards in swap files under " + d.param_swap_dir.string() + " (read through " +
         std::to_string(d.gather.read_buffers) + " host buffers)";
  else if (d.shard_params && d.param_tier != Tier::device)
    s += "parameter shards in " + std::string(tier_name(d.param_tier)) + " memory";
  const auto& o = d.optimizer;
  if (o.offload == Tier::nvme)
    s += (s.empty() ? "" : "; ") + std::string("optimizer state in swap files under ") +
         d.swap.dir.string() + " (sub-groups of " + sub_groups(d.swap.sub_group_size) +
         " elements through " + std::to_string(d.swap.buffer_count) +
         " host buffers), gradient shards in host memory";
  else if (o.offload != Tier::device && o.offload_ratio > 0)
    s += (s.empty() ? "" : "; ") + std::string("optimizer state and gradient shards ") +
         percent(o.offload_ratio) + " in " + std::string(tier_name(o.offload)) + " memory";
  if (!d.note.empty()) s += (s.empty() ? "" : " (") + d.note + (s.empty() ? "" : ")");
  return s;
}

// The optimizer writes the working shard sub-group by sub-group from its
// swap buffers; only the swapped optimizer streams that way.
void check(const ZeroDesign& d) {
  if (d.shard_params && d.param_tier == Tier::nvme && d.optimizer.offload != Tier::nvme)
    throw ConfigError("[strategy] " + d.name +
                      ": parameter shards in swap files need the optimizer state in swap files "
                      "too: run with --strategy zero3_nvme");
}

}  // namespace

void ZeroStrategy::setup(const StrategySetup& s) {
  params_ = s.params;
  comm_ = s.comm;
  kernels_ = s.kernels;
  chosen_ = resolve(
      {params_, comm_->size(), s.precision, s.grad_dtype, s.activation_bytes, s.device_budget});
  const ZeroDesign& d = chosen_;
  layout_.emplace(params_, comm_->size());
  const std::uint64_t begin = layout_->owned_begin(comm_->rank());
  const std::uint64_t end = layout_->owned_end(comm_->rank());
  check(d);
  if (d.shard_params)
    store_ = std::make_unique<ShardedParams>(
        *s.device, params_, s.modules, *layout_, *comm_, s.seed, s.precision,
        ParamPlacement{d.param_tier, d.param_swap_dir, d.swap.aio}, d.gather, d.name);
  else
    store_ = std::make_unique<ReplicatedParams>(*s.device, params_, *layout_, *comm_, s.seed,
                                                s.precision, d.allgather_bucket);
  OptimizerPlacement placement = d.optimizer;
  placement.working = store_->owned().tier();
  if (placement.offload == Tier::nvme)
    optimizer_ =
        std::make_unique<SwappedOptimizer>(*s.device, params_, *layout_, begin, end, s.optimizer,
                                           d.swap, s.grad_dtype, store_->owned(), comm_->rank());
  else
    optimizer_ =
        std::make_unique<ShardOptimizer>(*s.device, params_, *layout_, begin, end, s.optimizer,
                                         placement, s.grad_dtype, store_->owned().resident());
  ReducePlan plan = make_reduce_plan(params_, *layout_, d.reduce, d.reduce_settings);
  if (needs_full_grads(plan))
    full_grads_ = s.device->allocate(Tier::device, Category::grads,
                                     layout_->total() * dtype_size(s.grad_dtype));
  reducer_.emplace(*s.device, params_, *layout_, *comm_, std::move(plan), s.grad_dtype,
                   TypedPtr{full_grads_.data(), s.grad_dtype}, optimizer_->grad_pieces(), d.name);
}

void ZeroStrategy::begin_micro_step(bool last) {
  store_->begin_micro_step();
  reducer_->begin_micro_step(last);
}

void ZeroStrategy::after_backward(ModuleId m) {
  store_->release(m, true);
  reducer_->module_done(m);
}

void ZeroStrategy::write_param(ParamId p, const float* in) {
  store_->write(p, in);
  optimizer_->write_master(layout_->offset(p), in, layout_->numel(p));
}

StepResult ZeroStrategy::step(const StepArgs& a) {
  store_->end_step();
  reducer_->finish();
  // The reduced averages are in the shard: the whole buffer starts the next
  // step from zero.
  if (full_grads_) std::memset(full_grads_.data(), 0, full_grads_.bytes());
  const StepResult r = optimizer_->step(store_->owned(), comm_, *kernels_, a);
  if (!r.skipped) store_->publish();
  return r;
}

void ZeroStrategy::load_state(StateSource& source) {
  optimizer_->load(source, *layout_, store_->owned());
  store_->publish();
}

MemoryEstimate estimate_design(const ZeroDesign& d, const EstimateArgs& a) {
  check(d);
  const FlatLayout layout(a.params, a.world);
  const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(a.world);
  MemoryEstimate e = d.shard_params ? ShardedParams::estimate(a.params, layout, a.precision,
                                                              d.param_tier, d.gather)
                                    : ReplicatedParams::estimate(layout, a.precision);
  OptimizerPlacement placement = d.optimizer;
  placement.working = d.shard_params ? d.param_tier : Tier::device;
  const MemoryEstimate o =
      placement.offload == Tier::nvme
          ? SwappedOptimizer::estimate(shard, d.swap, a.precision, a.grad_dtype)
          : ShardOptimizer::estimate(shard, placement, a.precision, a.grad_dtype);
  for (std::size_t t = 0; t < kTierCount; ++t)
    for (std::size_t c = 0; c < kCategoryCount; ++c) e.bytes[t][c] += o.bytes[t][c];
  const ReducePlan plan = make_reduce_plan(a.params, layout, d.reduce, d.reduce_settings);
  const ReducePeaks peaks = worst_reduce_peaks(plan, a.world);
  const std::size_t g = dtype_size(a.grad_dtype);
  auto& device = e.bytes[static_cast<std::size_t>(Tier::device)];
  device[static_cast<std::size_t>(Category::grads)] +=
      (peaks.staged + (needs_full_grads(plan) ? layout.total() : 0)) * g;
  auto& comm = device[static_cast<std::size_t>(Category::comm)];
  comm = std::max(comm, peaks.recv * g);  // the store's and the reducer's do not coincide
  return e;
}

std::uint64_t device_bytes(const ZeroDesign& d, const EstimateArgs& a) {
  const MemoryEstimate e = estimate_design(d, a);
  std::uint64_t total = a.activation_bytes;
  for (auto b : e.bytes[static_cast<std::size_t>(Tier::device)]) total += b;
  return total;
}

MemoryEstimate ZeroStrategy::estimate(const EstimateArgs& a) const {
  const ZeroDesign d = resolve(a);
  MemoryEstimate e = estimate_design(d, a);
  e.note = describe(d);
  return e;
}

std::string ZeroStrategy::summary() const {
  return describe(chosen_);
}

StrategyStats ZeroStrategy::stats() const {
  return {reducer_->wait_seconds() + store_->wait_seconds()};
}

}  // namespace ztrain::shard
