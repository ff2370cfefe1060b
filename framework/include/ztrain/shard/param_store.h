// ParamStore: where a ZeRO rank's working parameters live and how a module
// sees them.
//
// Two stores: ReplicatedParams holds every parameter whole on every rank
// (ZeRO-1 and -2); after the optimizer stepped this rank's owned range,
// publish() all-gathers every rank's range into every replica.
// ShardedParams holds only the owned range (ZeRO-3), in the device tier,
// offloaded to the host or to a swap file on the NVMe tier (DeepSpeed's
// offload_param "cpu" and "nvme"), and gathers each module's parameters
// around it (ParamGatherer); publish() re-gathers the persistent ones. A strategy forwards the
// module hooks to its store, lets its optimizer write owned(), then calls publish(): the same calls
// for either, so a strategy picks its store and is done.
//
// Ownership: a store owns its buffers (category params) and keeps
// references to the parameter list, layout and communicator it was made
// with, which must outlive it.
// Errors: as FullReplica and ParamGatherer (ConfigError for a live cap below
// one module, Error when the module order changes, CommError), and
// SwappedShard's IoError.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/model.h"
#include "ztrain/shard/aio.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/owned_shard.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/strategy.h"

namespace ztrain::shard {

class ZTRAIN_API ParamStore {
 public:
  virtual ~ParamStore();
  virtual void begin_micro_step() = 0;
  virtual void fetch(ModuleId m, bool backward) = 0;
  virtual void release(ModuleId m, bool backward) = 0;
  // The micro-steps of this optimizer step are over.
  virtual void end_step() = 0;
  virtual TensorView view(ParamId p) = 0;
  // This rank's owned range of the working parameters.
  virtual OwnedShard& owned() = 0;
  // The optimizer changed owned(): every rank sees the new values
  // (collective).
  virtual void publish() = 0;
  // Whole fp32 values (export; collective).
  virtual void read(ParamId p, float* out) = 0;
  virtual double wait_seconds() const = 0;
};

class ZTRAIN_API ReplicatedParams final : public ParamStore {
 public:
  // Initialised from the seed on every rank (none: zeros, for a caller
  // that loads them next); allgather_bucket: elements per all-gather of
  // publish().
  ReplicatedParams(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                   Communicator& comm, std::optional<std::uint64_t> seed, DType precision,
                   std::uint64_t allgather_bucket);
  void begin_micro_step() override {}
  void fetch(ModuleId, bool) override {}
  void release(ModuleId, bool) override {}
  void end_step() override {}
  TensorView view(ParamId p) override { return replica_.param(p); }
  OwnedShard& owned() override { return owned_; }
  void publish() override;
  void read(ParamId p, float* out) override { replica_.read(p, out); }
  double wait_seconds() const override { return wait_s_; }
  // Bytes per rank: the whole model in the working precision.
  static MemoryEstimate estimate(const FlatLayout& layout, DType precision);

 private:
  const FlatLayout& layout_;
  Communicator& comm_;
  FullReplica replica_;
  ResidentShard owned_;  // a view of the replica
  std::uint64_t allgather_bucket_;
  double wait_s_ = 0;
};

// Where a sharded store keeps its owned range: a memory tier, or the nvme
// tier's swap file under `dir`.
struct ParamPlacement {
  Tier tier = Tier::device;
  std::filesystem::path dir;
  AioOptions aio;
};

class ZTRAIN_API ShardedParams final : public ParamStore {
 public:
  // The owned range is placed by `placement`, initialised from the seed
  // (none: left for the caller to load; a swap file is then not written
  // first); strategy names the caller in errors.
  ShardedParams(Device& device, const ParamSpecs& params, const ModuleSpecs& modules,
                const FlatLayout& layout, Communicator& comm, std::optional<std::uint64_t> seed,
                DType precision, const ParamPlacement& placement, const GatherOptions& gather,
                const std::string& strategy);
  void begin_micro_step() override { gatherer_->begin_micro_step(); }
  void fetch(ModuleId m, bool backward) override { gatherer_->fetch(m, backward); }
  void release(ModuleId m, bool backward) override { gatherer_->release(m, backward); }
  void end_step() override { gatherer_->end_step(); }
  TensorView view(ParamId p) override { return gatherer_->view(p); }
  OwnedShard& owned() override { return *owned_; }
  void publish() override { gatherer_->refresh(); }
  void read(ParamId p, float* out) override { gatherer_->read(p, out); }
  double wait_seconds() const override { return gatherer_->wait_seconds(); }
  // Bytes per rank: the owned range in its tier; gathered and persistent
  // parameters in the device tier; refresh's packed buffer (comm); for a
  // swapped range, the host buffers its reads go through (offload).
  static MemoryEstimate estimate(const ParamSpecs& params, const FlatLayout& layout,
                                 DType precision, Tier tier, const GatherOptions& gather);

 private:
  Buffer memory_;  // the owned range, when it lives in memory
  std::unique_ptr<OwnedShard> owned_;
  std::optional<ParamGatherer> gatherer_;
};

}  // namespace ztrain::shard
