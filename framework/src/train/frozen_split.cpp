#include "train/frozen_split.h"

#include <algorithm>
#include <vector>

#include "ztrain/dtype.h"
#include "ztrain/error.h"
#include "ztrain/shard/init.h"

namespace ztrain {
namespace {

// The trainable parameters, renumbered, and the frozen ones, each part with
// the model id of every entry.
struct Parts {
  ParamSpecs trainable, frozen;
  IdVector<ParamId, ParamId> trained, held, local;
};

Parts split(const ParamSpecs& params) {
  Parts p;
  for (ParamId id : params.ids()) {
    const bool trains = params[id].trainable;
    p.local.push_back(trains ? p.trainable.push_back(params[id]) : p.frozen.push_back(params[id]));
    (trains ? p.trained : p.held).push_back(id);
  }
  if (p.trainable.empty())
    throw ConfigError(
        "every parameter of the model is frozen: nothing would train; check the model's "
        "fine-tuning keys ([model] lora_rank, freeze_trainable_layers)");
  return p;
}

// A source or sink of the strategy's part, under the model's ids.
class ModelIdSource final : public StateSource {
 public:
  ModelIdSource(StateSource& s, const IdVector<ParamId, ParamId>& ids) : s_(s), ids_(ids) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    s_.get(ids_.at(p), first, count, a, out);
  }

 private:
  StateSource& s_;
  const IdVector<ParamId, ParamId>& ids_;
};

class ModelIdSink final : public StateSink {
 public:
  ModelIdSink(StateSink& s, const IdVector<ParamId, ParamId>& ids) : s_(s), ids_(ids) {}
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override {
    s_.put(ids_.at(p), first, count, a, values);
  }

 private:
  StateSink& s_;
  const IdVector<ParamId, ParamId>& ids_;
};

// The seed's initial values of the model's parameters, a fresh optimizer.
class SeedSource final : public StateSource {
 public:
  SeedSource(const ParamSpecs& params, std::uint64_t seed) : params_(params), seed_(seed) {}
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    if (a != StateArray::master) return std::fill(out, out + count, 0.0f);
    shard::initial_values(params_[p], index_of(p), seed_, first, count, out);
  }

 private:
  const ParamSpecs& params_;
  std::uint64_t seed_;
};

}  // namespace

// The strategy's prefetch and live budgets; the frozen shards stay on the
// device, so its swap files' read buffers do not apply.
shard::GatherOptions FrozenSplit::frozen_gather() const {
  shard::GatherOptions g = inner_->gather_options();
  g.read_buffers = 0;
  g.read_buffer_size = 0;
  return g;
}

void FrozenSplit::setup(const StrategySetup& s) {
  params_ = s.params;
  Parts parts = split(params_);
  local_ = std::move(parts.local);
  trained_ = std::move(parts.trained);
  held_ = std::move(parts.held);
  frozen_specs_ = std::move(parts.frozen);
  StrategySetup inner = s;
  inner.params = std::move(parts.trainable);
  inner.draw_initial_values = false;  // drawn below, under the model's ids
  inner_->setup(inner);
  sharded_ = shards_frozen(s.comm->size());
  rank_ = sharded_ ? s.comm->rank() : 0;
  frozen_layout_.emplace(frozen_specs_, sharded_ ? s.comm->size() : 1);
  if (sharded_)
    frozen_ = std::make_unique<shard::ShardedParams>(
        *s.device, frozen_specs_, s.modules, *frozen_layout_, *s.comm, std::nullopt, s.precision,
        shard::ParamPlacement{}, frozen_gather(), "the frozen parameters");
  else  // a rank's own whole copy: every rank loads all of it, nothing to publish
    frozen_ = std::make_unique<shard::ReplicatedParams>(*s.device, frozen_specs_, *frozen_layout_,
                                                        *alone_, std::nullopt, s.precision, 0);
  if (!s.draw_initial_values) return;
  SeedSource seeds(params_, s.seed);
  load_state(seeds);
  load_frozen(seeds);
}

// The frozen store's gathers follow the strategy's, on every rank alike.
void FrozenSplit::begin_micro_step(bool last) {
  inner_->begin_micro_step(last);
  frozen_->begin_micro_step();
}
void FrozenSplit::before_forward(ModuleId m) {
  inner_->before_forward(m);
  frozen_->fetch(m, false);
}
void FrozenSplit::after_forward(ModuleId m) {
  frozen_->release(m, false);
  inner_->after_forward(m);
}
void FrozenSplit::before_backward(ModuleId m) {
  inner_->before_backward(m);
  frozen_->fetch(m, true);
}
void FrozenSplit::after_backward(ModuleId m) {
  frozen_->release(m, true);
  inner_->after_backward(m);
}
StepResult FrozenSplit::step(const StepArgs& args) {
  frozen_->end_step();
  return inner_->step(args);
}

TensorView FrozenSplit::param_view(ParamId p) {
  if (params_[p].trainable) return inner_->param_view(local_[p]);
  return frozen_->view(local_[p]);
}

TensorView FrozenSplit::grad_view(ParamId p) {
  if (!params_[p].trainable)
    throw InternalError("the gradient of frozen parameter '" + params_[p].name + "' was asked for");
  return inner_->grad_view(local_[p]);
}

void FrozenSplit::read_param(ParamId p, float* out) {
  if (params_[p].trainable) return inner_->read_param(local_[p], out);
  frozen_->read(local_[p], out);
}

void FrozenSplit::save_state(StateSink& sink) {
  ModelIdSink mapped(sink, trained_);
  inner_->save_state(mapped);
}

void FrozenSplit::load_state(StateSource& source) {
  ModelIdSource mapped(source, trained_);
  inner_->load_state(mapped);
}

// This rank's owned range of the frozen layout (all of it when not
// sharded), in slices so a large matrix never needs a whole fp32 copy;
// padding written as zeros. A sharded store then gathers its persistent
// parameters (publish).
void FrozenSplit::load_frozen(StateSource& source) {
  constexpr std::uint64_t kSlice = std::uint64_t{1} << 22;
  const shard::FlatLayout& layout = *frozen_layout_;
  shard::OwnedShard& owned = frozen_->owned();
  std::vector<float> slice;
  std::vector<std::uint8_t> typed;
  for (std::uint64_t b = layout.owned_begin(rank_); b < layout.owned_end(rank_); b += kSlice) {
    const std::uint64_t e = std::min(layout.owned_end(rank_), b + kSlice);
    slice.assign(e - b, 0.0f);
    for (const shard::Segment& seg : layout.segments(b, e))
      source.get(held_[seg.param], seg.begin - layout.offset(seg.param), seg.end - seg.begin,
                 StateArray::master, slice.data() + (seg.begin - b));
    typed.resize((e - b) * dtype_size(owned.dtype()));
    convert(slice.data(), DType::f32, typed.data(), owned.dtype(), e - b);
    owned.write(b, {typed.data(), owned.dtype()}, e - b);
  }
  if (sharded_) frozen_->publish();
}

void FrozenSplit::draw_frozen(std::uint64_t seed) {
  SeedSource seeds(params_, seed);
  load_frozen(seeds);
}

MemoryEstimate FrozenSplit::estimate(const EstimateArgs& args) const {
  Parts parts = split(args.params);
  EstimateArgs inner = args;
  inner.params = std::move(parts.trainable);
  MemoryEstimate e = inner_->estimate(inner);
  if (!shards_frozen(args.world)) {
    const shard::FlatLayout frozen(parts.frozen, 1);
    e.bytes[Tier::device][Category::params] += frozen.total() * dtype_size(args.precision);
    return e;
  }
  const shard::FlatLayout frozen(parts.frozen, args.world);
  const MemoryEstimate held = shard::ShardedParams::estimate(parts.frozen, frozen, args.precision,
                                                             Tier::device, frozen_gather());
  for (Tier t : kTiers)
    for (Category c : kCategories) e.bytes[t][c] += held.bytes[t][c];
  return e;
}

std::string FrozenSplit::summary() const {
  std::uint64_t frozen = 0, trained = 0;
  for (const ParamSpec& p : params_)
    (p.trainable ? trained : frozen) += static_cast<std::uint64_t>(p.shape.numel());
  std::string s = "trains " + std::to_string(trained) + " parameters in " +
                  std::to_string(trained_.size()) + " tensors under the strategy; " +
                  std::to_string(frozen) + " frozen ones " +
                  (sharded_ ? "sharded over the ranks as the strategy shards its own"
                            : "held whole on every rank") +
                  ", with no gradient or optimizer state";
  if (std::string inner = inner_->summary(); !inner.empty()) s = inner + "\n" + s;
  return s;
}

}  // namespace ztrain
