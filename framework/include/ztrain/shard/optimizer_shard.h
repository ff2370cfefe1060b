// OptimizerShard: AdamW state for a range of the flat parameter buffer.
//
// Holds m and v (fp32) for flat elements [begin, end) in a chosen tier, and
// steps the matching slice of the parameter buffer given its gradients. In
// fp32 training with the working parameters in the same tier they are the
// master weights (ZeRO's 16 bytes per parameter: 4 param + 4 grad + 4 m +
// 4 v). With 16-bit working parameters, or working parameters in another
// tier (an offloaded optimizer: masters on the host, the working copy on
// the device), the shard also keeps fp32 master weights, steps them and
// writes the working copy in the same pass (ZeRO's 2 + 2 + 12). Weight
// decay applies to the parameters whose spec says so, segment by segment.
//
// Thread safety: one step at a time.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/strategy.h"

namespace ztrain::shard {

// Flat elements [begin, end) (offsets from a span's start) of parameters
// that `holders` consecutive ranks of the model-parallel group hold alike
// (0: every rank of it); the first rank of each such run of ranks counts
// them in the norm. kCountedElsewhere: a tied copy another pipeline stage
// counts (ParamSpec::tied_copy); this rank never does.
struct SharedRun {
  static constexpr int kCountedElsewhere = -1;
  std::uint64_t begin, end;
  int holders;
  bool operator==(const SharedRun&) const = default;
};

// The AdamW update of flat elements [begin, end): contiguous runs of one
// weight-decay setting (padding is in none, so it is never stepped), all
// in one kernel call. Pointers passed to step() are at element `begin`.
class ZTRAIN_API AdamWRange {
 public:
  AdamWRange(const ParamSpecs& params, const FlatLayout& layout, std::uint64_t begin,
             std::uint64_t end);
  // master, m, v: fp32; grads in their type (zeroed or kept, as
  // grad_after says); working: the working copy written in the same pass,
  // or empty when master is the working copy. scalars: the step's
  // multiplier and skip flag, where `kernels` reach (StepNorm::on).
  void step(float* master, TypedPtr grads, float* m, float* v, TypedPtr working,
            const Kernels& kernels, const OptimizerSettings& settings, double lr, std::int64_t step,
            const StepScalars* scalars, GradAfter grad_after) const {
    step_part(0, ~std::uint64_t{0}, master, grads, m, v, working, kernels, settings, lr, step,
              scalars, grad_after);
  }
  // The same for the range's elements [lo, hi) only (pointers still at
  // element 0 of the range). For the same bits as step(), lo and hi are
  // cuts() (a vector loop groups a run's elements from its first).
  void step_part(std::uint64_t lo, std::uint64_t hi, float* master, TypedPtr grads, float* m,
                 float* v, TypedPtr working, const Kernels& kernels,
                 const OptimizerSettings& settings, double lr, std::int64_t step,
                 const StepScalars* scalars, GradAfter grad_after) const;
  // Where to cut the range into parts of about `max` elements (a multiple
  // of 8): 0, then run starts and steps of `max` from a run's start.
  std::vector<std::uint64_t> cuts(std::uint64_t max) const;

 private:
  std::vector<AdamWRun> runs_;  // relative to the range's begin
};

// The kernels a step runs on, by where its state is: the device's for the
// device tier, the host's (cpu kernels) for state offloaded to host memory
// or NVMe. On the cpu device both are the same; a plain Kernels converts.
struct StepKernels {
  StepKernels(const Kernels& both) : device(both), host(both) {}  // NOLINT: converts
  StepKernels(const Kernels& on_device, const Kernels& on_host)
      : device(on_device), host(on_host) {}
  const Kernels& on(Tier t) const { return t == Tier::device ? device : host; }
  const Kernels& device;
  const Kernels& host;
};

class ZTRAIN_API OptimizerShard {
 public:
  // working: the slice [begin, end) of the working parameters, which live
  // in working_tier; when masters are kept they start from its values.
  OptimizerShard(Device& device, Tier tier, const ParamSpecs& params, const FlatLayout& layout,
                 std::uint64_t begin, std::uint64_t end, const OptimizerSettings& settings,
                 ConstTypedPtr working, Tier working_tier = Tier::device);

  // params, grads: the slice [begin, end) (element 0 is flat element begin).
  // scalars (StepNorm::on this shard's tier) scale the gradients in the
  // same pass (unscale and clip) or skip the step, zeroing them; stepped
  // gradients are zeroed or kept, as grad_after says. kernels: the ones for
  // this shard's tier. State in host memory with the working copy where
  // the host cannot reach (a GPU's) writes the rounded working copy into a
  // host buffer and copies it up, a chunk at a time, each chunk's copy
  // (Device::copy_async) running while the host steps the next.
  void step(TypedPtr params, TypedPtr grads, const Kernels& kernels, double lr, std::int64_t step,
            const StepScalars* scalars, GradAfter grad_after);
  // Checkpoints: save puts the masters (the working copy itself where it
  // is the master), m and v of [begin, end); load takes them and writes the
  // working copy from the masters, rounded to its type. working: the slice
  // [begin, end) of the working parameters. A save of [b, e) puts only those
  // elements (replicas split the saving).
  void save(StateSink& sink, const FlatLayout& layout, ConstTypedPtr working) const {
    save(sink, layout, working, begin_, end_);
  }
  void save(StateSink& sink, const FlatLayout& layout, ConstTypedPtr working, std::uint64_t b,
            std::uint64_t e) const;
  void load(StateSource& source, const FlatLayout& layout, TypedPtr working);

  Tier tier() const { return tier_; }
  Device& device() const { return device_; }
  std::uint64_t begin() const { return begin_; }
  std::uint64_t end() const { return end_; }
  // shared_runs of [begin, end).
  const std::vector<SharedRun>& shared() const { return shared_; }

 private:
  Device& device_;
  Tier tier_;
  AdamWRange range_;
  std::vector<SharedRun> shared_;
  Buffer m_, v_, master_;
  Buffer working_stage_;  // host copy of the working slice, where it cannot be reached
  std::uint64_t begin_, end_;
  OptimizerSettings settings_;
};

// One part of a rank's shard as the optimizer steps it: its state, and the
// matching slices of the working parameters and of the gradients.
struct ShardSlice {
  OptimizerShard* optimizer;
  TypedPtr params, grads;
};

// A piece of a rank's gradients the norm covers.
struct GradSpan {
  TypedPtr grads;
  std::uint64_t count;
  Tier tier;  // picks the kernels that sum it
  // Its runs of parameters other ranks of the model-parallel group hold
  // too (shared_runs), counted on one of them only.
  std::vector<SharedRun> shared = {};
};

// In a model split over a tensor group (some ParamSpec::split cut into
// parts), the runs of flat elements [begin, end) whose parameters other
// ranks of the group hold too: whole (every rank), or a part several hold
// (TensorSplit::copies); and a pipeline stage's tied copies (counted
// elsewhere); none in a whole model.
ZTRAIN_API std::vector<SharedRun> shared_runs(const ParamSpecs& params, const FlatLayout& layout,
                                              std::uint64_t begin, std::uint64_t end);

// The global gradient norm of a step, unscaled, and the scalars AdamW reads
// (StepScalars): the sum of squares of every piece, summed over `comm`
// unless it is null (so every rank clips by the norm ddp would see), then
// over StepArgs::model_parallel where there is one (its ranks' parts, a
// shared parameter counted by its first rank alone), then over
// StepArgs::pipeline (the stages' parameters, a tied copy counted on the
// stage that holds the original); a non-finite norm
// skips the step. Where every piece is in the device tier,
// all of it runs there, queued behind the gradients, and nothing is read
// back until result(): a GPU goes from the last gradient to the update
// without waiting for the host. With pieces in host memory (an offloaded
// optimizer, which steps on the host and needs the multiplier there
// anyway) the device pieces' partial sum comes back first and the scalars
// are finished on the host, then copied to the device for its pieces.
//
// Thread safety: one step at a time.
class ZTRAIN_API StepNorm {
 public:
  StepNorm(Device& device, const std::vector<GradSpan>& grads, Communicator* comm,
           const StepKernels& kernels, const StepArgs& args);
  StepNorm(const StepNorm&) = delete;  // on() points into it
  StepNorm& operator=(const StepNorm&) = delete;
  // The scalars for the kernels of tier t (the device's copy or the host's).
  const StepScalars* on(Tier t) const;
  // The norm and whether the step is skipped: read back from the device
  // when it finished them (on a GPU this waits for the work queued so far:
  // call it after the updates are queued), else read where they are.
  StepResult result() const;

 private:
  Device& device_;
  Tier home_;          // where the scalars are finished
  StepScalars host_;   // the host's record (plain memory: no pinned block per step)
  Buffer device_rec_;  // the device's, unless every piece is the host's
};

// One optimizer step over a rank's shard, in slices: the global norm, then
// AdamW on every slice (which zeroes the gradients instead on an overflow). The
// caller says what the next step does with the gradient buffers:
// GradAfter::zeroed where it accumulates into them (ddp, zero1),
// GradAfter::kept where its reduction overwrites them (zero2, zero3).
ZTRAIN_API StepResult step_shards(Device& device, const std::vector<ShardSlice>& slices,
                                  Communicator* comm, const StepKernels& kernels,
                                  const StepArgs& args, GradAfter grad_after);
// The same for a shard in one slice: params, grads are [begin, end).
ZTRAIN_API StepResult step_shard(OptimizerShard& optimizer, TypedPtr params, TypedPtr grads,
                                 Communicator* comm, const StepKernels& kernels,
                                 const StepArgs& args, GradAfter grad_after);

// Bytes per shard element the optimizer holds: m and v, plus the fp32
// master weights when the working precision is 16-bit or the working
// copy lives in another tier.
constexpr std::uint64_t optimizer_bytes_per_element(DType precision, bool elsewhere = false) {
  return precision == DType::f32 && !elsewhere ? 8 : 12;
}

}  // namespace ztrain::shard
