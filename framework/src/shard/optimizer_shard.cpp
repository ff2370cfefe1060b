#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/shard/state_ranges.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {

AdamWRange::AdamWRange(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t begin,
                       std::uint64_t end) {
  for (const auto& seg : layout.segments(begin, end)) {
    const bool decay = params[seg.param].decay;
    const std::uint64_t b = seg.begin - begin, e = seg.end - begin;
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == b)
      runs_.back().end = e;
    else
      runs_.push_back({b, e, decay});
  }
}

void AdamWRange::step_part(std::uint64_t lo, std::uint64_t hi, float* master, TypedPtr grads,
                           float* m, float* v, TypedPtr working, const Kernels& kernels,
                           const OptimizerSettings& settings, double lr, std::int64_t step,
                           const StepScalars* scalars, GradAfter grad_after) const {
  std::vector<AdamWRun> runs;
  for (const AdamWRun& r : runs_) {
    const std::uint64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
    if (b < e) runs.push_back({b, e, r.decay});
  }
  const double bc1 = 1.0 - std::pow(settings.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(settings.beta2, static_cast<double>(step));
  const bool l2 = settings.decay_mode == WeightDecayMode::l2;
  const auto decay = static_cast<float>(settings.weight_decay);
  const AdamWHyper h{static_cast<float>(lr),
                     static_cast<float>(settings.beta1),
                     static_cast<float>(settings.beta2),
                     static_cast<float>(settings.eps),
                     l2 ? 0.0f : decay,
                     static_cast<float>(bc1),
                     static_cast<float>(bc2),
                     l2 ? decay : 0.0f};
  kernels.adamw(master, grads, m, v, working, runs.data(), runs.size(), h, scalars, grad_after);
}

std::vector<std::uint64_t> AdamWRange::cuts(std::uint64_t max) const {
  std::vector<std::uint64_t> cuts{0};
  for (const AdamWRun& r : runs_) {
    if (r.end - cuts.back() <= max) continue;
    if (r.begin > cuts.back()) cuts.push_back(r.begin);
    for (std::uint64_t b = r.begin; r.end - b > max; b += max) cuts.push_back(b + max);
  }
  return cuts;
}

OptimizerShard::OptimizerShard(Device& device, Tier tier, const ParamSpecs& params,
                               const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
                               const OptimizerSettings& settings, ConstTypedPtr working,
                               Tier working_tier)
    : device_(device),
      tier_(tier),
      range_(params, layout, begin, end),
      shared_(shared_runs(params, layout, begin, end)),
      m_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      v_(device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float))),
      begin_(begin),
      end_(end),
      settings_(settings) {
  if (working.dtype != DType::f32 || working_tier != tier) {
    master_ = device.allocate(tier, Category::optimizer, (end - begin) * sizeof(float));
    device.convert(master_.as<float>(), working, end - begin);
    if (tier != Tier::device && !device.host_visible(working_tier)) {
      // A copy of the slice, so what steps do not write (padding between
      // runs) goes back up as it was.
      working_stage_ = device.allocate(Tier::host, Category::offload,
                                       (end - begin) * dtype_size(working.dtype), Fill::undefined);
      device.copy(working_stage_.data(), working.data, working_stage_.bytes());
    }
  }
}

void OptimizerShard::step(TypedPtr params, TypedPtr grads, const Kernels& kernels, double lr,
                          std::int64_t step, const StepScalars* scalars, GradAfter grad_after) {
  if (!master_ && params.dtype != DType::f32)
    throw InternalError(
        "OptimizerShard: 16-bit parameters given to a shard without master weights");
  float* master = master_ ? master_.as<float>() : static_cast<float*>(params.data);
  const TypedPtr working = !master_         ? TypedPtr{}
                           : working_stage_ ? TypedPtr{working_stage_.data(), params.dtype}
                                            : params;
  // The stage is host memory, stepped on the host: so are the scalars.
  if (!working_stage_ || scalars->skip)
    return range_.step(master, grads, m_.as<float>(), v_.as<float>(), working, kernels, settings_,
                       lr, step, scalars, grad_after);
  // Chunks of 4M elements (8 MB in bf16): a copy of that size takes a
  // fraction of a millisecond over PCIe, long against the tens of
  // microseconds a copy costs to start, while the last chunk's copy, the
  // one nothing overlaps, stays short (the arithmetic of PCIe 4-5 rates;
  // bench/gpu_check.sh's offload row is the measurement). The first
  // chunk's copy also waits for the device part's update queued before it.
  constexpr std::uint64_t kUploadChunk = 4u << 20;
  std::vector<std::uint64_t> cuts = range_.cuts(kUploadChunk);
  cuts.push_back(end_ - begin_);
  std::vector<CopyWork> uploads;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const std::uint64_t lo = cuts[c], hi = cuts[c + 1];
    range_.step_part(lo, hi, master, grads, m_.as<float>(), v_.as<float>(), working, kernels,
                     settings_, lr, step, scalars, grad_after);
    uploads.push_back(device_.copy_async(params.at(lo).data, working.at(lo).data,
                                         (hi - lo) * dtype_size(working.dtype)));
  }
  for (CopyWork& u : uploads) u.wait();
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

std::vector<SharedRun> shared_runs(const ParamSpecs& params, const FlatLayout& layout,
                                   std::uint64_t begin, std::uint64_t end) {
  std::vector<SharedRun> runs;
  const bool parts = has_tensor_parts(params);
  for (const auto& seg : layout.segments(begin, end)) {
    const ParamSpec& spec = params[seg.param];
    const TensorSplit& t = spec.split;
    if (!spec.tied_copy && (!parts || (t.dim >= 0 && t.copies <= 1))) continue;
    const int holders = spec.tied_copy ? SharedRun::kCountedElsewhere : t.dim < 0 ? 0 : t.copies;
    if (!runs.empty() && runs.back().end == seg.begin - begin && runs.back().holders == holders)
      runs.back().end = seg.end - begin;
    else
      runs.push_back({seg.begin - begin, seg.end - begin, holders});
  }
  return runs;
}

namespace {

// Whether this rank counts a shared run in the norm: the first of each
// run of ranks holding it does.
bool counts(const SharedRun& run, const Communicator* parts) {
  if (run.holders == SharedRun::kCountedElsewhere) return false;
  if (!parts) return true;
  const int every = run.holders > 0 ? run.holders : parts->size();
  return parts->rank() % every == 0;
}

// Adds the squares of g's elements to s, but for the shared runs another
// holder counts (a tensor part's holder where there is a model-parallel
// group, a tied copy's other stage always).
void add_squares(const Kernels& k, StepScalars* s, const GradSpan& g, const Communicator* parts) {
  if (g.shared.empty()) return k.sum_squares_add(s, g.grads, g.count);
  std::uint64_t at = 0;
  for (const SharedRun& run : g.shared) {
    if (counts(run, parts)) continue;
    if (run.begin > at) k.sum_squares_add(s, g.grads.at(at), run.begin - at);
    at = run.end;
  }
  if (g.count > at) k.sum_squares_add(s, g.grads.at(at), g.count - at);
}

}  // namespace

// The scalars are finished where their home is; with pieces in both tiers
// the device pieces are summed first, so the order of the sum (and its bits)
// is the same whichever device holds them.
StepNorm::StepNorm(Device& device, const std::vector<GradSpan>& grads, Communicator* comm,
                   const StepKernels& kernels, const StepArgs& args)
    : device_(device) {
  // Pieces not in the device tier (host memory, or NVMe's staging) are the host's.
  const auto device_piece = [](const GradSpan& g) { return g.tier == Tier::device; };
  const bool any_device = std::any_of(grads.begin(), grads.end(), device_piece);
  const bool any_host = !std::all_of(grads.begin(), grads.end(), device_piece);
  Communicator* const parts = args.model_parallel;
  home_ = any_host ? Tier::host : Tier::device;
  if (any_device || !any_host) {
    device_rec_ = device.allocate(Tier::device, Category::grads, sizeof(StepScalars));
    for (const GradSpan& g : grads)
      if (device_piece(g)) add_squares(kernels.device, device_rec_.as<StepScalars>(), g, parts);
  }
  if (any_host) {
    if (device_rec_) device.copy(&host_, device_rec_.data(), sizeof(StepScalars));
    for (const GradSpan& g : grads)
      if (!device_piece(g)) add_squares(kernels.host, &host_, g, parts);
  }
  // Unscaled before the fp32 all-reduce: a scaled square sum can pass
  // FLT_MAX where the true one does not.
  StepScalars* s = home_ == Tier::host ? &host_ : device_rec_.as<StepScalars>();
  const Kernels& k = kernels.on(home_);
  k.grad_norm_unscale(s, args.loss_scale);
  if (comm) comm->all_reduce(&s->reduced, 1, DType::f32, ReduceOp::sum);
  if (parts) parts->all_reduce(&s->reduced, 1, DType::f32, ReduceOp::sum);
  if (args.pipeline) args.pipeline->all_reduce(&s->reduced, 1, DType::f32, ReduceOp::sum);
  k.grad_norm_finish(s, comm || parts || args.pipeline, args.loss_scale, args.grad_clip);
  if (home_ == Tier::host && device_rec_) device.copy(device_rec_.data(), s, sizeof(StepScalars));
}

const StepScalars* StepNorm::on(Tier t) const {
  return t == Tier::device ? device_rec_.as<StepScalars>() : &host_;
}

StepResult StepNorm::result() const {
  StepScalars s = host_;
  if (home_ == Tier::device) device_.copy(&s, device_rec_.data(), sizeof s);
  StepResult r;
  r.grad_norm = s.grad_norm;
  r.overflow = s.skip != 0;
  r.skipped = r.overflow;
  return r;
}

StepResult step_shards(Device& device, const std::vector<ShardSlice>& slices, Communicator* comm,
                       const StepKernels& kernels, const StepArgs& args, GradAfter grad_after) {
  const auto size = [](const ShardSlice& s) { return s.optimizer->end() - s.optimizer->begin(); };
  std::vector<GradSpan> grads;
  for (const auto& s : slices)
    grads.push_back({s.grads, size(s), s.optimizer->tier(), s.optimizer->shared()});
  const StepNorm norm(device, grads, comm, kernels, args);
  for (const auto& s : slices) {
    const Tier t = s.optimizer->tier();
    s.optimizer->step(s.params, s.grads, kernels.on(t), args.lr, args.step, norm.on(t), grad_after);
  }
  return norm.result();
}

StepResult step_shard(OptimizerShard& optimizer, TypedPtr params, TypedPtr grads,
                      Communicator* comm, const StepKernels& kernels, const StepArgs& args,
                      GradAfter grad_after) {
  return step_shards(optimizer.device(), {{&optimizer, params, grads}}, comm, kernels, args,
                     grad_after);
}

}  // namespace ztrain::shard
