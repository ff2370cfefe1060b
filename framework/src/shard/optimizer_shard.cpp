#include "ztrain/shard/optimizer_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {

OptimizerShard::OptimizerShard(Device& device, Tier tier, const std::vector<ParamSpec>& params,
                               const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
                               const OptimizerSettings& settings, ConstTypedPtr working,
                               Tier working_tier)
    : m_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      v_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      begin_(begin),
      end_(end),
      settings_(settings) {
  if (working.dtype != DType::f32 || working_tier != tier) {
    master_ = device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float));
    convert(working.data, working.dtype, master_.data(), DType::f32, end - begin);
  }
  // Contiguous runs with one decay setting. Padding is in no segment, so it
  // is never stepped and stays zero.
  for (const auto& seg : layout.segments(begin, end)) {
    const bool decay = params[static_cast<std::size_t>(seg.param)].decay;
    const std::uint64_t b = seg.begin - begin, e = seg.end - begin;
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == b)
      runs_.back().end = e;
    else
      runs_.push_back({b, e, decay});
  }
}

void OptimizerShard::step(TypedPtr params, TypedPtr grads, const Kernels& kernels, double lr,
                          std::int64_t step, float grad_mult) {
  if (!master_ && params.dtype != DType::f32)
    throw InternalError(
        "OptimizerShard: 16-bit parameters given to a shard without master weights");
  const double bc1 = 1.0 - std::pow(settings_.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(settings_.beta2, static_cast<double>(step));
  for (const auto& r : runs_) {
    float* master =
        master_ ? master_.as<float>() + r.begin : static_cast<float*>(params.data) + r.begin;
    kernels.adamw(master, grads.at(r.begin), m_.as<float>() + r.begin, v_.as<float>() + r.begin,
                  master_ ? params.at(r.begin) : TypedPtr{}, r.end - r.begin,
                  static_cast<float>(lr), static_cast<float>(settings_.beta1),
                  static_cast<float>(settings_.beta2), static_cast<float>(settings_.eps),
                  r.decay ? static_cast<float>(settings_.weight_decay) : 0.0f, grad_mult,
                  static_cast<float>(bc1), static_cast<float>(bc2));
  }
}

void OptimizerShard::write_master(std::uint64_t flat_begin, const float* values, std::uint64_t n) {
  const std::uint64_t b = std::max(flat_begin, begin_), e = std::min(flat_begin + n, end_);
  if (!master_ || b >= e) return;
  std::copy(values + (b - flat_begin), values + (e - flat_begin),
            master_.as<float>() + (b - begin_));
}

StepResult step_shards(const std::vector<ShardSlice>& slices, Communicator* comm,
                       const Kernels& kernels, const StepArgs& args) {
  const auto size = [](const ShardSlice& s) { return s.optimizer->end() - s.optimizer->begin(); };
  // Unscaled before the fp32 all-reduce: a scaled square sum can pass
  // FLT_MAX where the true one does not.
  double sq = 0;
  for (const auto& s : slices) sq += kernels.sum_squares(s.grads, size(s));
  sq /= args.loss_scale * args.loss_scale;
  if (comm) {
    float part = static_cast<float>(sq);
    comm->all_reduce(&part, 1, DType::f32, ReduceOp::sum);
    sq = part;
  }
  StepResult r;
  r.grad_norm = std::sqrt(sq);
  r.overflow = !std::isfinite(r.grad_norm);
  r.skipped = r.overflow;
  if (r.skipped) {
    for (const auto& s : slices) std::memset(s.grads.data, 0, size(s) * dtype_size(s.grads.dtype));
    return r;
  }
  const float mult =
      static_cast<float>(1.0 / args.loss_scale) * clip_multiplier(r.grad_norm, args.grad_clip);
  for (const auto& s : slices)
    s.optimizer->step(s.params, s.grads, kernels, args.lr, args.step, mult);
  return r;
}

StepResult step_shard(OptimizerShard& optimizer, TypedPtr params, TypedPtr grads,
                      Communicator* comm, const Kernels& kernels, const StepArgs& args) {
  return step_shards({{&optimizer, params, grads}}, comm, kernels, args);
}

float clip_multiplier(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0f;
  const double coef = grad_norm / max_norm;
  return coef > 1.0 ? static_cast<float>(1.0 / coef) : 1.0f;
}

}  // namespace ztrain::shard
