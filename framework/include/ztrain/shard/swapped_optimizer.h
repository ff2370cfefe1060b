// SwappedOptimizer: a rank's optimizer state on the NVMe tier (ZeRO-Infinity).
//
// The fp32 master weights, m and v of this rank's owned range [begin, end)
// live in a swap file under `dir`, cut into sub-groups of at most
// `sub_group_size` elements (each sub-group's three arrays side by side,
// page-aligned; sub_group_size is rounded up to a whole number of pages of
// elements); the fp32 gradient shard the reducer lands in lives in host
// memory. step() takes the global norm from the gradients, then streams the
// sub-groups through `buffer_count` host buffers: while one sub-group is
// stepped, the next ones are read and the previous one is written back, so
// the disk and the CPU AdamW work at once. The new working copy of each
// sub-group goes from its buffer to the owned shard, wherever that lives
// (memory, or its own swap file with offload_param.device = "nvme"). With
// one buffer each sub-group is read, stepped and written in turn. Every
// byte is accounted in its tier: the file in nvme (optimizer), the buffers
// in host (offload), the gradient shard in host (grads).
//
// Ownership: owns its engine, file (removed with it, and however the
// process ends) and buffers; keeps references to `params` and `layout`,
// and to the owned shard last stepped, which must outlive it.
// Errors: IoError from the engine (a missing or unwritable nvme_path, a
// memory file system, a full disk, a failed transfer, each naming the path).
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/shard/aio.h"
#include "ztrain/shard/owned_shard.h"
#include "ztrain/shard/shard_optimizer.h"

namespace ztrain::shard {

struct SwapOptions {
  std::filesystem::path dir;                  // nvme_path
  std::uint64_t sub_group_size = 1000000000;  // elements stepped at a time
  int buffer_count = 4;                       // host buffers, one sub-group each
  AioOptions aio;
};

class ZTRAIN_API SwappedOptimizer final : public OptimizerStore {
 public:
  // working: this rank's owned range of the working parameters, the
  // masters' initial values; rank names the swap file.
  SwappedOptimizer(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                   std::uint64_t begin, std::uint64_t end, const OptimizerSettings& settings,
                   const SwapOptions& swap, DType grad_dtype, OwnedShard& working, int rank);
  ~SwappedOptimizer() override;
  SwappedOptimizer(const SwappedOptimizer&) = delete;
  SwappedOptimizer& operator=(const SwappedOptimizer&) = delete;

  std::vector<GradPiece> grad_pieces() const override;
  StepResult step(OwnedShard& working, Communicator* comm, const StepKernels& kernels,
                  const StepArgs& args) override;
  // Sub-group by sub-group through the first buffer: the state read from
  // the swap file and put (save), or taken, written to the file and its
  // working copy to the owned shard (load).
  void save(StateSink& sink, const FlatLayout& layout, OwnedShard& working) override;
  void load(StateSource& source, const FlatLayout& layout, OwnedShard& working) override;

  // The elements a sub-group holds when `asked` (sub_group_size) are asked
  // for: rounded up to a whole number of pages of elements (2048).
  static std::uint64_t sub_group_elements(std::uint64_t asked);
  // sub_group_size "auto" for a shard of `elements` streamed through
  // `buffer_count` buffers with a working copy of type `working`, where this
  // rank's share of the machine's RAM is `host_budget` (0: unknown). The
  // rule and its measured reasons are in the .cpp.
  static std::uint64_t auto_sub_group(std::uint64_t elements, int buffer_count, DType working,
                                      std::uint64_t host_budget);
  // Bytes per tier and category of `elements` of a shard so placed, whose
  // working copy is of type `working`.
  static MemoryEstimate estimate(std::uint64_t elements, const SwapOptions& swap, DType working,
                                 DType grad_dtype);

 private:
  struct SubGroup {
    std::uint64_t begin, end;  // flat
    std::uint64_t offset;      // in the file
    std::uint64_t stride;      // bytes per array, page-aligned
    AdamWRange range;
  };
  // The sub-group's master, m, v (which 0-2) and new working copy (3) in a
  // host buffer.
  float* array(std::size_t buffer, const SubGroup& g, int which) const;
  void read(std::size_t g, std::size_t buffer);
  void write(std::size_t g, std::size_t buffer);

  Device& device_;
  std::uint64_t begin_, end_;
  std::vector<SharedRun> shared_;  // shared_runs of [begin_, end_)
  OptimizerSettings settings_;
  DType grad_dtype_;
  AioEngine engine_;
  int file_ = -1;
  std::uint64_t file_bytes_ = 0;
  std::vector<SubGroup> groups_;
  std::vector<Buffer> buffers_;
  Buffer grads_;
  std::vector<AioEngine::Ticket> reads_, writes_;  // per sub-group
  std::vector<AioEngine::Ticket> working_writes_;  // to working_, per sub-group
  OwnedShard* working_ = nullptr;
};

}  // namespace ztrain::shard
