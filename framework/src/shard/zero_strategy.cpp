#include "ztrain/shard/zero_strategy.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ztrain/error.h"
#include "ztrain/shard/state_ranges.h"

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

// How a design shards and what it offloads, and its note: the run header
// and the estimate.
std::string describe(const ZeroDesign& d, int world) {
  std::string s;
  const auto add = [&](const std::string& part) { s += (s.empty() ? "" : "; ") + part; };
  const auto percent = [](double r) {
    return std::to_string(static_cast<int>(r * 100 + 0.5)) + "%";
  };
  if (const int g = shard_group(d, world); g < world)
    add("state sharded within groups of " + std::to_string(g) + " ranks, replicated across " +
        std::to_string(world / g) + " groups");
  if (d.shard_params && d.param_tier == Tier::nvme)
    add("parameter shards in swap files under " + d.param_swap_dir.string() + " (read through " +
        std::to_string(d.gather.read_buffers) + " host buffers)");
  else if (d.shard_params && d.param_tier != Tier::device)
    add("parameter shards in " + std::string(tier_name(d.param_tier)) + " memory");
  const auto& o = d.optimizer;
  if (o.offload == Tier::nvme)
    add("optimizer state in swap files under " + d.swap.dir.string() + " (sub-groups of " +
        sub_groups(d.swap.sub_group_size) + " elements through " +
        std::to_string(d.swap.buffer_count) + " host buffers), gradient shards in host memory");
  else if (o.offload != Tier::device && o.offload_ratio > 0)
    add("optimizer state and gradient shards " + percent(o.offload_ratio) + " in " +
        std::string(tier_name(o.offload)) + " memory");
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

int shard_group(const ZeroDesign& d, int world) {
  const int g = d.shard_group_size;
  if (g == 0) return world;
  if (g < 0 || world % g != 0)
    throw ConfigError("[strategy] " + d.name + ": shard_group_size = " + std::to_string(g) +
                      " does not divide the " + std::to_string(world) +
                      " ranks; give a divisor of the world size (0: shard over every rank)");
  return g;
}

void ZeroStrategy::setup(const StrategySetup& s) {
  params_ = s.params;
  comm_ = s.comm;
  world_ = s.comm->size();
  kernels_ = s.kernels;
  host_kernels_ = s.host_kernels ? s.host_kernels : s.kernels;
  device_ = s.device;
  chosen_ = resolve({params_, comm_->size(), s.precision, s.grad_dtype, s.activation_bytes, 0,
                     s.device_budget, s.device->host_visible(Tier::device), s.host_budget});
  const ZeroDesign& d = chosen_;
  // Hybrid: groups of consecutive ranks, and the ranks at the same place
  // in every group, each made a communicator.
  if (const int g = shard_group(d, comm_->size()), r = comm_->rank(); g < comm_->size()) {
    group_comm_ = comm_->split(r / g, r % g);
    replica_comm_ = comm_->split(r % g, r / g);
    comm_ = group_comm_.get();
  }
  layout_.emplace(params_, comm_->size());
  const std::uint64_t begin = layout_->owned_begin(comm_->rank());
  const std::uint64_t end = layout_->owned_end(comm_->rank());
  check(d);
  if (d.shard_params)
    store_ = std::make_unique<ShardedParams>(
        *s.device, params_, s.modules, *layout_, *comm_, s.initial_seed(), s.precision,
        ParamPlacement{d.param_tier, d.param_swap_dir, d.swap.aio}, d.gather, d.name);
  else
    store_ = std::make_unique<ReplicatedParams>(*s.device, params_, *layout_, *comm_,
                                                s.initial_seed(), s.precision, d.allgather_bucket);
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

StepResult ZeroStrategy::step(const StepArgs& a) {
  store_->end_step();
  reducer_->finish();
  // The reduced averages are in the shard: the whole buffer starts the next
  // step from zero.
  if (full_grads_) device_->fill_zero(full_grads_.data(), full_grads_.bytes());
  if (replica_comm_) average_across_groups();
  const StepResult r = optimizer_->step(store_->owned(), comm_, {*kernels_, *host_kernels_}, a);
  if (!r.skipped) store_->publish();
  return r;
}

// Every group's shard holds its group's average; the average of those is
// the whole world's (the groups are equal in size).
void ZeroStrategy::average_across_groups() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<CommWork> works;
  for (const GradPiece& g : optimizer_->grad_pieces())
    works.push_back(replica_comm_->all_reduce_async(g.data.data, g.end - g.begin, g.data.dtype,
                                                    ReduceOp::average));
  wait_all(works);
  replica_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ZeroStrategy::save_state(StateSink& sink) {
  if (!replica_comm_) return optimizer_->save(sink, *layout_, store_->owned());
  // Copy i of the shard saves the i-th of replica-count equal parts.
  const std::uint64_t b = layout_->owned_begin(comm_->rank()),
                      n = layout_->owned_end(comm_->rank()) - b;
  const auto copies = static_cast<std::uint64_t>(replica_comm_->size()),
             i = static_cast<std::uint64_t>(replica_comm_->rank());
  ClippedSink part(sink, *layout_, b + n * i / copies, b + n * (i + 1) / copies);
  optimizer_->save(part, *layout_, store_->owned());
}

void ZeroStrategy::load_state(StateSource& source) {
  optimizer_->load(source, *layout_, store_->owned());
  store_->publish();
}

MemoryEstimate estimate_design(const ZeroDesign& d, const EstimateArgs& a) {
  check(d);
  const int world = shard_group(d, a.world);  // the ranks a shard is 1/world of
  const FlatLayout layout(a.params, world);
  const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(world);
  MemoryEstimate e = d.shard_params ? ShardedParams::estimate(a.params, layout, a.precision,
                                                              d.param_tier, d.gather)
                                    : ReplicatedParams::estimate(layout, a.precision);
  OptimizerPlacement placement = d.optimizer;
  placement.working = d.shard_params ? d.param_tier : Tier::device;
  const MemoryEstimate o =
      placement.offload == Tier::nvme
          ? SwappedOptimizer::estimate(shard, d.swap, a.precision, a.grad_dtype)
          : ShardOptimizer::estimate(shard, placement, a.precision, a.grad_dtype,
                                     a.host_reaches_device);
  for (Tier t : kTiers)
    for (Category c : kCategories) e.bytes[t][c] += o.bytes[t][c];
  const ReducePlan plan = make_reduce_plan(a.params, layout, d.reduce, d.reduce_settings);
  const ReducePeaks peaks = worst_reduce_peaks(plan, world);
  const std::size_t g = dtype_size(a.grad_dtype);
  auto& device = e.bytes[Tier::device];
  device[Category::grads] += (peaks.staged + (needs_full_grads(plan) ? layout.total() : 0)) * g;
  // On a GPU a bucket landing in a host piece holds its receive buffer
  // until its copy is done, at most one bucket's beyond the plan
  // (GradReducer).
  std::uint64_t landing = 0;
  if (!a.host_reaches_device && placement.offload != Tier::device && placement.offload_ratio > 0)
    for (const ReduceBucket& b : plan.buckets)
      for (const std::uint64_t part : b.counts) landing = std::max(landing, part);
  // The store's comm buffers and the reducer's do not coincide.
  auto& comm = device[Category::comm];
  comm = std::max(comm, (peaks.recv + landing) * g);
  return e;
}

std::uint64_t device_bytes(const ZeroDesign& d, const EstimateArgs& a) {
  const MemoryEstimate e = estimate_design(d, a);
  std::uint64_t total = a.activation_bytes;
  for (auto b : e.bytes[Tier::device]) total += b;
  return total;
}

std::uint64_t auto_sub_group(const ZeroDesign& d, const EstimateArgs& a) {
  const int world = shard_group(d, a.world);
  const FlatLayout layout(a.params, world);
  return SwappedOptimizer::auto_sub_group(layout.total() / static_cast<std::uint64_t>(world),
                                          d.swap.buffer_count, a.precision,
                                          a.host_budget.value_or(0));
}

MemoryEstimate ZeroStrategy::estimate(const EstimateArgs& a) const {
  const ZeroDesign d = resolve(a);
  MemoryEstimate e = estimate_design(d, a);
  e.note = describe(d, a.world);
  return e;
}

std::string ZeroStrategy::summary() const {
  return describe(chosen_, world_);
}

StrategyStats ZeroStrategy::stats() const {
  return {reducer_->wait_seconds() + store_->wait_seconds() + replica_wait_s_};
}

}  // namespace ztrain::shard
