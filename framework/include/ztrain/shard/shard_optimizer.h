// ShardOptimizer: the optimizer side of a rank's ZeRO shard, placed by tier.
//
// For this rank's owned range [begin, end) of the flat layout it holds the
// gradient shard (in the gradients' dtype: the reducer lands into it, and
// it accumulates the micro-steps) and the AdamW state (m, v, and fp32
// master weights where the working copy is 16-bit or lives in another
// tier). The range is cut in two parts: the first stays on the device, the
// last `offload_ratio` of it goes to the `offload` tier (the host for
// ZeRO-Offload; a ratio below 1 is DeepSpeed's partial offload, 0 or an
// offload tier of device keeps everything on the device). Each part is a
// GradPiece the reducer lands in and a slice the optimizer steps; step()
// takes the global norm over both, so the split changes nothing in the
// arithmetic. On the cpu device the host tier is the same RAM: nothing is
// copied that need not be, but every buffer is accounted in its tier, so
// the device tier's peak is what a GPU would hold.
//
// Ownership: owns its buffers; keeps references to `params` and `layout`,
// which must outlive it.
// Errors: OutOfMemoryError from the device's budget of a tier.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/shard/owned_shard.h"
#include "ztrain/strategy.h"

namespace ztrain::shard {

// What a ZeRO strategy asks of the optimizer side of its shard, wherever
// its state lives (ShardOptimizer: device and host memory;
// SwappedOptimizer: files on the NVMe tier).
class ZTRAIN_API OptimizerStore {
 public:
  virtual ~OptimizerStore();
  // Where the reducer lands this rank's averaged gradients.
  virtual std::vector<GradPiece> grad_pieces() const = 0;
  // The global norm over every piece, then (unless it overflowed) AdamW
  // over the shard, writing `working`, the owned range of the working
  // parameters.
  virtual StepResult step(OwnedShard& working, Communicator* comm, const StepKernels& kernels,
                          const StepArgs& args) = 0;
  // Checkpoints: save puts the master, m and v of every element of the
  // shard; load takes them and writes the working copy from the masters
  // into `working` (OptimizerShard::save and load, wherever the state lives).
  virtual void save(StateSink& sink, const FlatLayout& layout, OwnedShard& working) = 0;
  virtual void load(StateSource& source, const FlatLayout& layout, OwnedShard& working) = 0;
};

struct OptimizerPlacement {
  Tier offload = Tier::device;  // where the offloaded part lives
  double offload_ratio = 0;     // its share of the range, 0..1
  Tier working = Tier::device;  // where the working parameters' owned range lives
};

class ZTRAIN_API ShardOptimizer final : public OptimizerStore {
 public:
  // working: this rank's owned range of the working parameters (the masters
  // start from it where they are kept).
  ShardOptimizer(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                 std::uint64_t begin, std::uint64_t end, const OptimizerSettings& settings,
                 const OptimizerPlacement& placement, DType grad_dtype, ConstTypedPtr working);

  std::vector<GradPiece> grad_pieces() const override;
  // `working` must be in memory (resident); a swapped shard goes with
  // SwappedOptimizer.
  StepResult step(OwnedShard& working, Communicator* comm, const StepKernels& kernels,
                  const StepArgs& args) override;
  void save(StateSink& sink, const FlatLayout& layout, OwnedShard& working) override;
  void load(StateSource& source, const FlatLayout& layout, OwnedShard& working) override;

  // Bytes per tier and category of `elements` of a shard so placed;
  // host_reaches_device as in EstimateArgs (where it is false, an offloaded
  // part keeps a host copy of its working slice: OptimizerShard).
  static MemoryEstimate estimate(std::uint64_t elements, const OptimizerPlacement& placement,
                                 DType precision, DType grad_dtype, bool host_reaches_device);
  // Where the range is cut: [begin, split) on the device, the rest offloaded.
  static std::uint64_t split(std::uint64_t begin, std::uint64_t end,
                             const OptimizerPlacement& placement);

 private:
  struct Part {
    std::uint64_t begin, end;
    Buffer grads;
    std::optional<OptimizerShard> state;
  };
  Device& device_;
  std::vector<Part> parts_;
  std::uint64_t begin_;
  DType grad_dtype_;
};

}  // namespace ztrain::shard
