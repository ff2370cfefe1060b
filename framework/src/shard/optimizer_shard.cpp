#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/shard/state_ranges.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {

AdamWRange::AdamWRange(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                       std::uint64_t begin, std::uint64_t end) {
  for (const auto& seg : layout.segments(begin, end)) {
    const bool decay = params[static_cast<std::size_t>(seg.param)].decay;
    const std::uint64_t b = seg.begin - begin, e = seg.end - begin;
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == b)
      runs_.back().end = e;
    else
      runs_.push_back({b, e, decay});
  }
}

void AdamWRange::step(float* master, TypedPtr grads, float* m, float* v, TypedPtr working,
                      const Kernels& kernels, const OptimizerSettings& settings, double lr,
                      std::int64_t step, float grad_mult, GradAfter grad_after) const {
  const double bc1 = 1.0 - std::pow(settings.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(settings.beta2, static_cast<double>(step));
  for (const auto& r : runs_)
    kernels.adamw(master + r.begin, grads.at(r.begin), m + r.begin, v + r.begin,
                  working ? working.at(r.begin) : TypedPtr{}, r.end - r.begin,
                  static_cast<float>(lr), static_cast<float>(settings.beta1),
                  static_cast<float>(settings.beta2), static_cast<float>(settings.eps),
                  r.decay ? static_cast<float>(settings.weight_decay) : 0.0f, grad_mult,
                  static_cast<float>(bc1), static_cast<float>(bc2), grad_after);
}

OptimizerShard::OptimizerShard(Device& device, Tier tier, const std::vector<ParamSpec>& params,
                               const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
                               const OptimizerSettings& settings, ConstTypedPtr working,
                               Tier working_tier)
    : device_(device),
      tier_(tier),
      range_(params, layout, begin, end),
      m_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      v_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      begin_(begin),
      end_(end),
      settings_(settings) {
  if (working.dtype != DType::f32 || working_tier != tier) {
    master_ = device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float));
    device.convert(master_.as<float>(), working, end - begin);
    if (tier != Tier::device && !device.host_visible(working_tier))
      working_stage_ = device.allocate(Tier::host, Category::offload,
                                       (end - begin) * dtype_size(working.dtype), Fill::undefined);
  }
}

void OptimizerShard::step(TypedPtr params, TypedPtr grads, const Kernels& kernels, double lr,
                          std::int64_t step, float grad_mult, GradAfter grad_after) {
  if (!master_ && params.dtype != DType::f32)
    throw InternalError(
        "OptimizerShard: 16-bit parameters given to a shard without master weights");
  float* master = master_ ? master_.as<float>() : static_cast<float*>(params.data);
  const TypedPtr working = !master_         ? TypedPtr{}
                           : working_stage_ ? TypedPtr{working_stage_.data(), params.dtype}
                                            : params;
  range_.step(master, grads, m_.as<float>(), v_.as<float>(), working, kernels, settings_, lr, step,
              grad_mult, grad_after);
  if (working_stage_) device_.copy(params.data, working_stage_.data(), working_stage_.bytes());
}

void OptimizerShard::discard(TypedPtr grads) {
  device_.fill_zero(grads.data, (end_ - begin_) * dtype_size(grads.dtype));
}

void OptimizerShard::save(StateSink& sink, const FlatLayout& layout, ConstTypedPtr working,
                          std::uint64_t b, std::uint64_t e) const {
  if (b < begin_ || e > end_ || b > e)
    throw InternalError("OptimizerShard::save: range outside the shard");
  const float* master = master_ ? master_.as<float>() : static_cast<const float*>(working.data);
  const std::uint64_t at = b - begin_;
  put_range(sink, layout, b, e, StateArray::master, master + at, device_, tier_);
  put_range(sink, layout, b, e, StateArray::m, m_.as<float>() + at, device_, tier_);
  put_range(sink, layout, b, e, StateArray::v, v_.as<float>() + at, device_, tier_);
}

void OptimizerShard::load(StateSource& source, const FlatLayout& layout, TypedPtr working) {
  if (master_) {
    get_range(source, layout, begin_, end_, StateArray::master, master_.as<float>(), device_,
              tier_);
    device_.convert(working, master_.as<float>(), end_ - begin_);
  } else {
    get_range(source, layout, begin_, end_, StateArray::master, static_cast<float*>(working.data),
              device_, tier_);
  }
  get_range(source, layout, begin_, end_, StateArray::m, m_.as<float>(), device_, tier_);
  get_range(source, layout, begin_, end_, StateArray::v, v_.as<float>(), device_, tier_);
}

GradNorm global_grad_norm(const std::vector<GradSpan>& grads, Communicator* comm,
                          const StepKernels& kernels, const StepArgs& args) {
  // Unscaled before the fp32 all-reduce: a scaled square sum can pass
  // FLT_MAX where the true one does not.
  double sq = 0;
  for (const GradSpan& g : grads) sq += kernels.on(g.tier).sum_squares(g.grads, g.count);
  sq /= args.loss_scale * args.loss_scale;
  if (comm) {
    float part = static_cast<float>(sq);
    comm->all_reduce(&part, 1, DType::f32, ReduceOp::sum);
    sq = part;
  }
  GradNorm norm;
  norm.result.grad_norm = std::sqrt(sq);
  norm.result.overflow = !std::isfinite(norm.result.grad_norm);
  norm.result.skipped = norm.result.overflow;
  norm.grad_mult = static_cast<float>(1.0 / args.loss_scale) *
                   clip_multiplier(norm.result.grad_norm, args.grad_clip);
  return norm;
}

StepResult step_shards(const std::vector<ShardSlice>& slices, Communicator* comm,
                       const StepKernels& kernels, const StepArgs& args, GradAfter grad_after) {
  const auto size = [](const ShardSlice& s) { return s.optimizer->end() - s.optimizer->begin(); };
  std::vector<GradSpan> grads;
  for (const auto& s : slices) grads.push_back({s.grads, size(s), s.optimizer->tier()});
  const GradNorm norm = global_grad_norm(grads, comm, kernels, args);
  if (norm.result.skipped) {
    for (const auto& s : slices) s.optimizer->discard(s.grads);
    return norm.result;
  }
  for (const auto& s : slices)
    s.optimizer->step(s.params, s.grads, kernels.on(s.optimizer->tier()), args.lr, args.step,
                      norm.grad_mult, grad_after);
  return norm.result;
}

StepResult step_shard(OptimizerShard& optimizer, TypedPtr params, TypedPtr grads,
                      Communicator* comm, const StepKernels& kernels, const StepArgs& args,
                      GradAfter grad_after) {
  return step_shards({{&optimizer, params, grads}}, comm, kernels, args, grad_after);
}

float clip_multiplier(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0f;
  const double coef = grad_norm / max_norm;
  return coef > 1.0 ? static_cast<float>(1.0 / coef) : 1.0f;
}

}  // namespace ztrain::shard
