#include "ztrain/shard/shard_optimizer.h"

#include "ztrain/error.h"

#include <cmath>

namespace ztrain::shard {

OptimizerStore::~OptimizerStore() = default;

std::uint64_t ShardOptimizer::split(std::uint64_t begin, std::uint64_t end,
                                    const OptimizerPlacement& placement) {
  if (placement.offload == Tier::device || placement.offload_ratio <= 0) return end;
  if (placement.offload_ratio >= 1) return begin;
  const std::uint64_t n = end - begin;
  const auto offloaded =
      static_cast<std::uint64_t>(std::llround(placement.offload_ratio * static_cast<double>(n)));
  // A multiple of 16 elements from the start, as the shards are.
  return begin + (n - offloaded) / 16 * 16;
}

ShardOptimizer::ShardOptimizer(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                               std::uint64_t begin, std::uint64_t end,
                               const OptimizerSettings& settings,
                               const OptimizerPlacement& placement, DType grad_dtype,
                               ConstTypedPtr working)
    : device_(device), begin_(begin), grad_dtype_(grad_dtype) {
  const std::uint64_t mid = split(begin, end, placement);
  parts_.reserve(2);
  for (auto [b, e, tier] :
       {std::tuple{begin, mid, Tier::device}, std::tuple{mid, end, placement.offload}}) {
    if (b >= e) continue;
    Part& part = parts_.emplace_back();
    part.begin = b;
    part.end = e;
    part.grads = device.allocate(tier, Category::grads, (e - b) * dtype_size(grad_dtype));
    part.state.emplace(device, tier, params, layout, b, e, settings,
                       ConstTypedPtr(working.at(b - begin)), placement.working);
  }
}

std::vector<GradPiece> ShardOptimizer::grad_pieces() const {
  std::vector<GradPiece> pieces;
  for (const Part& p : parts_)
    pieces.push_back({p.begin, p.end, {p.grads.data(), grad_dtype_}, p.grads.tier()});
  return pieces;
}

StepResult ShardOptimizer::step(OwnedShard& shard, Communicator* comm, const StepKernels& kernels,
                                const StepArgs& args) {
  const TypedPtr working = shard.resident();
  if (!working)
    throw InternalError(
        "ShardOptimizer steps working parameters held in memory; a shard in a swap file is "
        "SwappedOptimizer's");
  std::vector<ShardSlice> slices;
  for (Part& p : parts_)
    slices.push_back({&*p.state, working.at(p.begin - begin_), {p.grads.data(), grad_dtype_}});
  // The reducer writes each step's first landing over the pieces
  // (GradReducer): nothing to zero.
  return step_shards(device_, slices, comm, kernels, args, GradAfter::kept);
}

void ShardOptimizer::save(StateSink& sink, const FlatLayout& layout, OwnedShard& working) {
  const TypedPtr w = working.resident();
  for (const Part& p : parts_) p.state->save(sink, layout, w.at(p.begin - begin_));
}

void ShardOptimizer::load(StateSource& source, const FlatLayout& layout, OwnedShard& working) {
  const TypedPtr w = working.resident();
  for (Part& p : parts_) p.state->load(source, layout, w.at(p.begin - begin_));
}

MemoryEstimate ShardOptimizer::estimate(std::uint64_t elements, const OptimizerPlacement& placement,
                                        DType precision, DType grad_dtype,
                                        bool host_reaches_device) {
  const std::uint64_t on_device = split(0, elements, placement);
  MemoryEstimate e;
  for (auto [n, tier] :
       {std::pair{on_device, Tier::device}, std::pair{elements - on_device, placement.offload}}) {
    if (n == 0) continue;
    auto& bytes = e.bytes[tier];
    bytes[Category::grads] += n * dtype_size(grad_dtype);
    const bool masters = precision != DType::f32 || placement.working != tier;
    bytes[Category::optimizer] +=
        n * optimizer_bytes_per_element(precision, placement.working != tier);
    if (masters && tier != Tier::device && placement.working == Tier::device &&
        !host_reaches_device)
      bytes[Category::offload] += n * dtype_size(precision);
  }
  return e;
}

}  // namespace ztrain::shard
