// ZeroStrategy: a ZeRO stage assembled from the shard toolkit.
//
// Every ZeRO stage, offloaded or not, is the same four hooks over three
// parts: a ParamStore (replicated or sharded parameters, in a tier), a
// GradReducer executing a reduction plan (when gradients are reduced, where
// they wait), and an OptimizerStore (the gradient shard and AdamW state of
// this rank's owned range: a ShardOptimizer split between the device and
// host memory, or a SwappedOptimizer on the NVMe tier; the parameter shard
// on the NVMe tier needs the latter).
// A stage is a Design: which store, which reduction policy, where the
// optimizer lives. The built-in zero2, zero3 and cpu_offload strategies are
// a constructor and an options declaration over this class; a third-party
// stage can be too.
//
// Per micro-step: begin_micro_step starts the store and the reducer; the
// forward and backward hooks fetch and release the store's parameters, and
// each module's backward completion runs the reducer's plan. step() ends
// the store's step, finishes the reduction, steps the optimizer (global
// norm over every part, writing the store's owned range) and publishes the
// new parameters. save_state and load_state carry the optimizer's shard in
// and out of checkpoints; a load publishes like a step. estimate() adds up
// the same parts' estimates, so it covers what setup() allocates.
//
// Hybrid sharding (FSDP's HYBRID_SHARD): with shard_group_size G below the
// world size N, the state is sharded over groups of G consecutive ranks and
// each of the N / G groups holds a whole copy. Everything above runs within
// the group (the layout has G shards); once per step, after the group's
// reduction, each gradient shard is averaged with the same shard of the
// other groups, so every copy steps alike and the result equals a run
// sharded over all N. The copies of a shard each save a part of it to a
// checkpoint (ClippedSink), so it is written once, by every rank.
//
// Errors: as the parts'; setup raises OutOfMemoryError past a tier's budget.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/export.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/param_store.h"
#include "ztrain/shard/reduce_plan.h"
#include "ztrain/shard/shard_optimizer.h"
#include "ztrain/shard/swapped_optimizer.h"
#include "ztrain/strategy.h"

namespace ztrain::shard {

struct ZeroDesign {
  std::string name;                            // the strategy, in errors
  bool shard_params = false;                   // ZeRO-3: ShardedParams, else ReplicatedParams
  Tier param_tier = Tier::device;              // where a sharded store keeps the owned range
  std::filesystem::path param_swap_dir;        // its swap files' directory, for tier nvme
  GatherOptions gather;                        // a sharded store's
  std::uint64_t allgather_bucket = 500000000;  // a replicated store's publish
  int shard_group_size = 0;                    // ranks sharing one copy of the state; 0: all
  ReducePolicy reduce = ReducePolicy::shard_during_backward;
  ReduceSettings reduce_settings;
  OptimizerPlacement optimizer;  // `working` is filled from the store; offload nvme: all of it
  SwapOptions swap;              // the optimizer's files, when its offload tier is nvme
  std::string note;              // why the design is what it is (run header)
};

// The ranks over which the design shards its state for a world of `world`:
// shard_group_size, or every rank. ConfigError unless it divides the world.
ZTRAIN_API int shard_group(const ZeroDesign& d, int world);
// Bytes per tier and category a rank of this design allocates (activations
// aside), for a run of `a`'s sizes.
ZTRAIN_API MemoryEstimate estimate_design(const ZeroDesign& d, const EstimateArgs& a);
// The device tier's share of it plus the activations: what a budget must
// hold (each category at its peak, an upper bound).
ZTRAIN_API std::uint64_t device_bytes(const ZeroDesign& d, const EstimateArgs& a);
// sub_group_size "auto" for d's rank shard at `a`'s sizes and host budget
// (SwappedOptimizer::auto_sub_group).
ZTRAIN_API std::uint64_t auto_sub_group(const ZeroDesign& d, const EstimateArgs& a);

class ZTRAIN_API ZeroStrategy : public Strategy {
 public:
  void setup(const StrategySetup& s) final;
  void begin_micro_step(bool last) final;
  void before_forward(ModuleId m) final { store_->fetch(m, false); }
  void after_forward(ModuleId m) final { store_->release(m, false); }
  void before_backward(ModuleId m) final { store_->fetch(m, true); }
  void after_backward(ModuleId m) final;
  TensorView param_view(ParamId p) final { return store_->view(p); }
  TensorView grad_view(ParamId p) final { return reducer_->grad(p); }
  void read_param(ParamId p, float* out) final { store_->read(p, out); }
  StepResult step(const StepArgs& a) final;
  void save_state(StateSink& sink) final;
  void load_state(StateSource& source) final;
  MemoryEstimate estimate(const EstimateArgs& a) const final;
  StrategyStats stats() const final;
  // What is offloaded, and the design's note; empty when nothing is.
  std::string summary() const final;
  bool shards_params() const final { return design_.shard_params; }
  GatherOptions gather_options() const final { return design_.gather; }

 protected:
  explicit ZeroStrategy(ZeroDesign design) : design_(std::move(design)) {}
  // The design for a run of these sizes. A stage that sizes itself to the
  // device budget overrides it; setup() and estimate() both ask, so an
  // estimate shows what a run would choose.
  virtual ZeroDesign resolve(const EstimateArgs&) const { return design_; }
  const ZeroDesign& design() const { return design_; }

 private:
  void average_across_groups();
  ZeroDesign design_;
  ZeroDesign chosen_;  // resolve()'s answer at setup
  ParamSpecs params_;
  Communicator* comm_ = nullptr;  // this rank's group: every rank unless hybrid
  std::unique_ptr<Communicator> group_comm_, replica_comm_;  // hybrid only
  int world_ = 1;                                            // every rank, groups or not
  double replica_wait_s_ = 0;                                // blocked averaging across groups
  const Kernels* kernels_ = nullptr;
  const Kernels* host_kernels_ = nullptr;  // for offloaded state
  Device* device_ = nullptr;
  std::optional<FlatLayout> layout_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<OptimizerStore> optimizer_;
  Buffer full_grads_;  // plans that reduce from a whole gradient buffer
  std::optional<GradReducer> reducer_;
};

}  // namespace ztrain::shard
