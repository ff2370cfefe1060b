// The strategy plugin interface: who owns parameters, gradients and
// optimizer state, where they live, and when they move.
//
// The host calls setup once with the model's parameter and module lists,
// the device, the communicator and the optimizer settings; the strategy
// allocates and initialises everything (initial values are a pure function
// of the seed and the element index, see shard/init.h, so every layout
// starts from the same weights). During a micro-step the model reaches
// parameters and gradients only through param_view/grad_view between the
// module hooks. step() finishes gradient reduction, computes the global
// gradient norm, clips, runs the optimizer and publishes the new parameters; the next
// step's first gradient write must not see this step's sums (a strategy
// zeroes a full gradient buffer it accumulates into; a gradient shard that
// the next reduction overwrites is kept as it is). save_state and load_state carry
// the optimizer state in and out of checkpoints (ztrain/optimizer_state.h).
//
// Errors: setup raises OutOfMemoryError when the budget is too small,
// ConfigError for unusable options; CommError may come out of any hook.
// Thread safety: called from the training thread only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/dtype.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/plugin.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/tensor.h"

namespace ztrain {

// How weight_decay enters Adam's update: decoupled (AdamW, torch.optim.AdamW,
// DeepSpeed's default adam_w_mode) or added to the gradient as an L2 term
// (torch.optim.Adam's weight_decay, DeepSpeed's adam_w_mode false).
enum class WeightDecayMode : std::uint8_t { decoupled, l2 };

struct OptimizerSettings {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  WeightDecayMode decay_mode = WeightDecayMode::decoupled;
};

struct StrategySetup {
  ParamSpecs params;
  ModuleSpecs modules;
  Device* device = nullptr;
  Communicator* comm = nullptr;
  const Kernels* kernels = nullptr;
  // The cpu kernels, for state a strategy keeps in host memory or on NVMe
  // (offloaded optimizer steps); the same as `kernels` on the cpu device,
  // and null there for a caller that never offloads.
  const Kernels* host_kernels = nullptr;
  OptimizerSettings optimizer;
  // Working parameters are held and gathered in `precision`; gradients are
  // held, accumulated across micro-steps and reduced in `grad_dtype`. When
  // precision is 16-bit the optimizer shard keeps fp32 master weights.
  DType precision = DType::f32;
  DType grad_dtype = DType::f32;
  std::uint64_t seed = 0;  // parameter initialisation
  // False when load_state fills every parameter right after setup (a
  // resume, [model] init_from): drawing first values from the seed would be
  // work thrown away (for gpt2-124m about a second per rank).
  bool draw_initial_values = true;
  // The seed to draw first values from; none when they are not drawn.
  std::optional<std::uint64_t> initial_seed() const {
    return draw_initial_values ? std::optional<std::uint64_t>(seed) : std::nullopt;
  }
  // What a strategy that sizes itself to the device needs: the model's
  // activations for one micro-batch (its estimate) and the device tier's
  // budget ([device] memory_limit; none: unlimited).
  std::uint64_t activation_bytes = 0;
  std::optional<std::uint64_t> device_budget;
  // This rank's share of its machine's RAM, as in EstimateArgs.
  std::optional<std::uint64_t> host_budget;
};

struct StepArgs {
  double lr = 0;
  std::int64_t step = 1;  // 1-based optimizer step (AdamW bias correction)
  double grad_clip = 0;   // max global norm; 0 disables
  double loss_scale = 1;  // gradients carry this factor; step() divides it out
  // The ranks holding the other parts of this rank's parameters (the
  // tensor group; null where there are none): the gradient norm sums over
  // them too, each parameter they all hold whole counted once.
  Communicator* model_parallel = nullptr;
  // The pipeline's stages holding the model's other parameters (null
  // where there is one stage): the norm sums over them as well, a tied
  // copy (ParamSpec::tied_copy) counted on its other stage.
  Communicator* pipeline = nullptr;
};

struct StepResult {
  double grad_norm = 0;  // of the unscaled gradients, before clipping
  bool overflow = false;
  bool skipped = false;
};

// What the communicator cannot see: time the strategy spent blocked on its
// collectives (bytes are counted by the communicator itself).
struct StrategyStats {
  double comm_wait_s = 0;  // since setup
};

struct EstimateArgs {
  ParamSpecs params;
  int world = 1;
  DType precision = DType::f32;
  DType grad_dtype = DType::f32;
  // As in StrategySetup: a strategy that sizes itself estimates what it
  // would choose.
  std::uint64_t activation_bytes = 0;
  // What the model keeps in host memory (offloaded activation
  // checkpoints): the host adds it to the host tier beside the strategy's
  // estimate, as it adds activation_bytes to the device tier.
  std::uint64_t host_activation_bytes = 0;
  std::optional<std::uint64_t> device_budget;
  // Whether host code can touch the device tier (the cpu device: yes; a
  // GPU: no, so state stepped in host memory needs host buffers for what
  // it writes to the device).
  bool host_reaches_device = true;
  // This rank's share of its machine's RAM (physical memory over the ranks
  // on the machine), for a strategy that sizes its host buffers to it;
  // none: unknown.
  std::optional<std::uint64_t> host_budget;
};

// Bytes per tier and category, per rank, and what the strategy would choose
// for these sizes where it sizes itself (empty: nothing to say).
struct MemoryEstimate {
  TierTable bytes;
  std::string note;
  MemoryEstimate& set(Tier t, Category c, std::uint64_t b) {
    bytes[t][c] = b;
    return *this;
  }
};

class ZTRAIN_API Strategy : public Plugin {
 public:
  ~Strategy() override;
  virtual void setup(const StrategySetup& setup) = 0;
  // Before each micro-step; `last` is the last micro-step of this optimizer
  // step (gradient reduction may start during its backward).
  virtual void begin_micro_step(bool last) = 0;
  // Around each module's forward and backward (the model calls them in
  // that order, modules forward then in reverse); by default nothing, for
  // strategies whose parameters are always whole (ddp, zero1).
  virtual void before_forward(ModuleId) {}
  virtual void after_forward(ModuleId) {}
  virtual void before_backward(ModuleId) {}
  virtual void after_backward(ModuleId) {}
  virtual TensorView param_view(ParamId p) = 0;
  virtual TensorView grad_view(ParamId p) = 0;
  // The full value of a parameter's working copy in fp32, wherever its
  // pieces live (export). Collective for strategies that shard: every rank
  // calls it.
  virtual void read_param(ParamId p, float* out) = 0;
  virtual StepResult step(const StepArgs& args) = 0;
  // Checkpoints (between steps; gradients are not state). save_state puts the
  // master, m and v of the elements this rank saves; over all ranks, every
  // element of every parameter exactly once (ranks that hold replicas split
  // them). Not collective. load_state takes the state of every element this
  // rank holds from `source`, reading nothing else, sets the working copy
  // from the masters and brings any replicas up to date: collective.
  virtual void save_state(StateSink& sink) = 0;
  virtual void load_state(StateSource& source) = 0;
  virtual MemoryEstimate estimate(const EstimateArgs& args) const = 0;
  virtual StrategyStats stats() const = 0;
  // After setup: what the run header says about the strategy's choices
  // (e.g. what it offloads and why); empty for none.
  virtual std::string summary() const { return {}; }
  // Whether the strategy shards the parameters over the ranks (ZeRO-3),
  // known from its options: the host shards the parameters it holds beside
  // the strategy (a fine-tuning run's frozen ones) alike. No by default.
  virtual bool shards_params() const { return false; }
  // How it gathers the parameters it shards (ZeRO-3's prefetch and live
  // budgets), so that the host gathers the parameters it shards beside
  // them alike; the defaults where it shards none.
  virtual shard::GatherOptions gather_options() const { return {}; }
  // Why the strategy cannot run under pipeline parallelism (the reason,
  // for a message naming the key); empty when it can. A pipeline stage
  // runs its micro-batches' forwards and backwards interleaved as the
  // schedule says, all as accumulating micro-steps, then one last
  // micro-step of hooks alone (every module's backward, in reverse, with
  // nothing computed) in which the strategy reduces: it must keep each
  // rank's whole gradient until then (ddp, zero1). The default: it cannot.
  virtual std::string pipeline_refusal() const;
};

}  // namespace ztrain
