// FrozenSplit: the strategy of a run whose model freezes parameters
// (ParamSpec::trainable false: LoRA's base weights, the layers `freeze`
// leaves out).
//
// The run's strategy sees only the trainable parameters, as a list of their
// own (the model's order, renumbered), so every strategy, third-party ones
// included, trains them exactly as it trains a whole model: its gradients,
// reduction, norm, clipping, optimizer and checkpoints cover what trains
// and nothing else. The frozen parameters are held beside it in the
// working precision, with no gradient and no optimizer state (a
// StepContext hands out null gradient views for them): whole on every
// rank, or, where the strategy shards its parameters (ZeRO-3), sharded
// alike and gathered module by module right after the strategy's own
// gathers (shard/param_store.h's ShardedParams with the strategy's own
// prefetch and live budgets, Strategy::gather_options, on the same
// communicator, in the same order on every rank). A checkpoint stores the trainable state alone, as
// PEFT's do: the frozen values are not state, they come back from where
// they came from, the base model's weights or the seed (load_frozen).
//
// Initial values are drawn per parameter from its id in the model's list,
// not in the strategy's (setup loads them through load_state), so an
// adapter starts from the same numbers whether the base comes from the
// seed or from [model] init_from (whose import draws what the file lacks).
//
// Ownership: holds the wrapped strategy (shared) and the frozen buffers.
// Errors: ConfigError when nothing is trainable; the wrapped strategy's.
// Thread safety: the training thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/param_store.h"
#include "ztrain/strategy.h"

namespace ztrain {

class FrozenSplit final : public Strategy {
 public:
  explicit FrozenSplit(std::shared_ptr<Strategy> inner) : inner_(std::move(inner)) {}

  void setup(const StrategySetup& s) override;
  void begin_micro_step(bool last) override;
  void before_forward(ModuleId m) override;
  void after_forward(ModuleId m) override;
  void before_backward(ModuleId m) override;
  void after_backward(ModuleId m) override;
  TensorView param_view(ParamId p) override;
  TensorView grad_view(ParamId p) override;
  void read_param(ParamId p, float* out) override;
  StepResult step(const StepArgs& args) override;
  // The trainable parameters' state, under the model's ids.
  void save_state(StateSink& sink) override;
  void load_state(StateSource& source) override;
  // The frozen parameters' values: the master array of what this rank
  // holds of each (all of it, or its shard), from `source` (the base
  // model's weights, or the seed's values). Collective when sharded.
  void load_frozen(StateSource& source);
  // The same from the seed's initial values (what setup draws when it
  // draws): a resume of a run without [model] init_from.
  void draw_frozen(std::uint64_t seed);
  MemoryEstimate estimate(const EstimateArgs& args) const override;
  StrategyStats stats() const override { return inner_->stats(); }
  std::string summary() const override;
  bool shards_params() const override { return inner_->shards_params(); }
  std::string pipeline_refusal() const override { return inner_->pipeline_refusal(); }
  shard::GatherOptions gather_options() const override { return inner_->gather_options(); }

 private:
  // Whether the frozen store is sharded over `world` ranks: where the
  // strategy shards its own parameters and there is more than one rank.
  bool shards_frozen(int world) const { return inner_->shards_params() && world > 1; }
  shard::GatherOptions frozen_gather() const;
  std::shared_ptr<Strategy> inner_;
  ParamSpecs params_;                          // the model's
  IdVector<ParamId, ParamId> local_;           // model id -> id in its part
  IdVector<ParamId, ParamId> trained_, held_;  // ids in each part -> model id
  ParamSpecs frozen_specs_;
  std::optional<shard::FlatLayout> frozen_layout_;
  // The communicator of a copy held whole (a world of this rank alone), and
  // the store: its layout and communicator live as long as it.
  std::unique_ptr<Communicator> alone_ = make_local_communicator();
  std::unique_ptr<shard::ParamStore> frozen_;
  bool sharded_ = false;
  int rank_ = 0;
};

}  // namespace ztrain
