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

// The AdamW update of flat elements [begin, end): contiguous runs of one
// weight-decay setting (padding is in none, so it is never stepped), one
// kernel call each. Pointers passed to step() are at element `begin`.
class ZTRAIN_API AdamWRange {
 public:
  AdamWRange(const std::vector<ParamSpec>& params, const FlatLayout& layout, std::uint64_t begin,
             std::uint64_t end);
  // master, m, v: fp32; grads in their type (zeroed or kept, as
  // grad_after says); working: the working copy written in the same pass,
  // or empty when master is the working copy.
  void step(float* master, TypedPtr grads, float* m, float* v, TypedPtr working,
            const Kernels& kernels, const OptimizerSettings& settings, double lr, std::int64_t step,
            float grad_mult, GradAfter grad_after) const;

 private:
  struct Run {
    std::uint64_t begin, end;  // relative to the range's begin
    bool decay;
  };
  std::vector<Run> runs_;
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
  OptimizerShard(Device& device, Tier tier, const std::vector<ParamSpec>& params,
                 const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
                 const OptimizerSettings& settings, ConstTypedPtr working,
                 Tier working_tier = Tier::device);

  // params, grads: the slice [begin, end) (element 0 is flat element begin).
  // grad_mult scales gradients in the same pass (unscale and clip); the
  // stepped gradients are zeroed or kept, as grad_after says. kernels: the
  // ones for this shard's tier. State in host memory with the working copy
  // where the host cannot reach (a GPU's) writes the rounded working copy
  // into a host buffer and copies it up.
  void step(TypedPtr params, TypedPtr grads, const Kernels& kernels, double lr, std::int64_t step,
            float grad_mult, GradAfter grad_after);
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

  // Zeroes the slice's gradients (a skipped step: they are not applied).
  void discard(TypedPtr grads);
  Tier tier() const { return tier_; }
  std::uint64_t begin() const { return begin_; }
  std::uint64_t end() const { return end_; }

 private:
  Device& device_;
  Tier tier_;
  AdamWRange range_;
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

// The global gradient norm of a step, unscaled: the sum of squares of
// every piece, summed over `comm` unless it is null (so every rank clips by
// the norm ddp would see). A non-finite norm is an overflow: the step is
// skipped and the caller zeroes the gradients. grad_mult folds the unscale
// and the clip into one multiplier for the update.
struct GradNorm {
  StepResult result;
  float grad_mult = 1;
};
struct GradSpan {
  TypedPtr grads;
  std::uint64_t count;
  Tier tier;  // picks the kernels that sum it
};
ZTRAIN_API GradNorm global_grad_norm(const std::vector<GradSpan>& grads, Communicator* comm,
                                     const StepKernels& kernels, const StepArgs& args);

// One optimizer step over a rank's shard, in slices: the global norm, then
// on an overflow the gradients zeroed, else AdamW on every slice. The
// caller says what the next step does with the gradient buffers:
// GradAfter::zeroed where it accumulates into them (ddp, zero1),
// GradAfter::kept where its reduction overwrites them (zero2, zero3).
ZTRAIN_API StepResult step_shards(const std::vector<ShardSlice>& slices, Communicator* comm,
                                  const StepKernels& kernels, const StepArgs& args,
                                  GradAfter grad_after);
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

// Clip multiplier DeepSpeed's way: 1 / max(1, norm / max_norm) (1 when
// max_norm is 0 or the norm is not finite).
ZTRAIN_API float clip_multiplier(double grad_norm, double max_norm);

}  // namespace ztrain::shard
