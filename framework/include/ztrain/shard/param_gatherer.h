// ParamGatherer: sharded parameters made whole around the modules using them.
//
// ZeRO-3's parameter side. Each rank holds only its owned range of the flat
// working parameters (the shard, in the run's precision, in whatever tier
// the strategy placed it). fetch(m) before a module runs makes every
// parameter m uses whole on this rank; release(m) after it frees them.
// Parameters are gathered by group: a group is a run of consecutive
// parameters used by the same modules (gather_groups), so a transformer
// block arrives in one irregular all-gather of its flat range rather than
// one per tensor; small persistent parameters lying inside that range ride
// along. The rules (DeepSpeed's option names and meanings; sizes in
// elements):
// - param_persistence_threshold: a parameter of at most this many elements
//   is gathered once and kept; refresh() re-gathers all of them after the
//   optimizer changed the shard, in one all-gather into a packed buffer
//   (comm) of all of them (each rank sends the parts it owns), unpacked
//   into place.
// - trace: the first training micro-step records its sequence of fetches
//   (module, forward or backward); every later micro-step must repeat it,
//   else fetch raises Error naming the position and both modules.
// - prefetch_bucket_size: from the second micro-step on, fetch also issues
//   the gathers of the next positions' groups, up to this many elements, so
//   they arrive while the current module computes.
// - max_live_parameters: gathered non-persistent elements never exceed it;
//   prefetch stops short of it, and groups kept for reuse are evicted
//   (farthest next use first) to make room.
// - max_reuse_distance: a group is kept after its module when the fetches
//   before its next use need fewer than this many elements.
// Outside training micro-steps (evaluation, export) fetches are on demand
// and released right after. The schedule is a pure function of the trace
// (make_gather_plan), so an estimate computes the same peak.
//
// The shard may live in memory or in a swap file (OwnedShard): a gather
// borrows this rank's part of its group from it, in place or read into a
// host buffer, until the collective is done. At most read_buffers gathers
// hold such a buffer at once: issuing one more first waits for the oldest
// (DeepSpeed's offload_param.buffer_count), so prefetch cannot pull a whole
// swapped shard into host memory.
//
// Ownership: gathered and persistent buffers are (device, params); `shard`
// belongs to the caller and must outlive this.
// Errors: ConfigError at construction when one module needs more than
// max_live_parameters, or a swapped group's part exceeds read_buffer_size; Error, naming
// `strategy`, when the module order changes; InternalError when a parameter is viewed while not
// gathered; CommError. Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/options.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/owned_shard.h"
#include "ztrain/tensor.h"

namespace ztrain::shard {

struct GatherOptions {
  std::uint64_t prefetch_bucket_size = 50000000;
  std::uint64_t max_live_parameters = 1000000000;
  std::uint64_t param_persistence_threshold = 100000;
  std::uint64_t max_reuse_distance = 1000000000;
  // For a shard in a swap file (offload_param.buffer_count, buffer_size):
  // gathers that may hold a host read buffer at once (0: no limit), and the
  // most elements of a group's part one may hold (0: no limit).
  std::uint64_t read_buffers = 0;
  std::uint64_t read_buffer_size = 0;
};

// What happens at each trace position, in gather units (group ids): units
// released to make room, gathered (needed now, then prefetched), released
// after the module. peak_live: the most elements gathered at once.
struct GatherPlan {
  std::vector<std::vector<GroupId>> evict, gather, release;  // per trace position
  std::uint64_t peak_live = 0;
};

// needs[i]: the units position i uses; size: elements per unit. Every
// needs[i] must fit in max_live_parameters.
ZTRAIN_API GatherPlan make_gather_plan(const std::vector<std::vector<GroupId>>& needs,
                                       const IdVector<GroupId, std::uint64_t>& size,
                                       const GatherOptions& options);

// A step's trace as the host runs it: forward of modules 0..M-1, then
// backward from M-1 to 0.
struct TraceEntry {
  ModuleId module;
  bool backward;
  bool operator==(const TraceEntry&) const = default;
};
ZTRAIN_API std::vector<TraceEntry> standard_trace(std::size_t modules);

// A gather unit: the flat range [begin, end) from the first to the last of
// `params`, consecutive non-persistent parameters with the same used_by
// (persistent ones between them are in the range, not in `params`).
struct GatherGroup {
  std::uint64_t begin = 0, end = 0;
  std::vector<ParamId> params;
  std::vector<ModuleId> used_by;
  std::uint64_t size() const { return end - begin; }
};
using GatherGroups = IdVector<GroupId, GatherGroup>;
ZTRAIN_API GatherGroups gather_groups(const ParamSpecs& params, const FlatLayout& layout,
                                      std::uint64_t persistence_threshold);
// The groups each of `modules` modules uses.
using GroupNeeds = IdVector<ModuleId, std::vector<GroupId>>;
ZTRAIN_API GroupNeeds group_needs(const GatherGroups& groups, std::size_t modules);
// offload_param.buffer_size (elements; 0: unlimited) must hold a rank's
// part of every group, judged from every rank's part so that all refuse
// alike: a ConfigError naming the first group past it (by its first
// parameter) and the size to raise it to. The run's gatherer and the
// estimate both ask, so an estimate refuses what the run would.
ZTRAIN_API void check_read_buffer_size(const GatherGroups& groups, const FlatLayout& layout,
                                       const ParamSpecs& params, std::uint64_t buffer_size);

// The gathers of the standard trace over `layout`: the groups, each
// module's groups (needs), each trace position's groups, and the plan over
// them. What the estimates walk; ConfigError when a module needs more than
// max_live_parameters.
struct StandardGathers {
  GatherGroups groups;
  GroupNeeds needs;
  std::vector<std::vector<GroupId>> trace;
  GatherPlan plan;
};
ZTRAIN_API StandardGathers standard_gathers(const ParamSpecs& params, const FlatLayout& layout,
                                            const GatherOptions& options);

// What a gatherer holds beyond the shard when the model runs the standard
// trace: persistent elements (params) and the plan's peak of gathered ones
// (params), and the packed persistent elements refresh() receives (comm).
struct GatherPeaks {
  std::uint64_t persistent = 0;
  std::uint64_t live = 0;
  std::uint64_t packed = 0;
};
ZTRAIN_API GatherPeaks estimate_gather_peaks(const ParamSpecs& params,
                                             const GatherOptions& options);

// DeepSpeed's ZeRO-3 options (prefetch_bucket_size, max_live_parameters,
// param_persistence_threshold, max_reuse_distance; elements), declared
// with DeepSpeed's defaults, and read back.
ZTRAIN_API void declare_gather_options(OptionList& o);
ZTRAIN_API GatherOptions gather_options(const Options& o);

// For tests: what the gatherer did, in order. position is the trace
// position (none outside training micro-steps); live the non-persistent
// elements gathered or in flight right after the event.
struct GatherEvent {
  enum class Kind : std::uint8_t { gather, use, release };
  Kind kind;
  GroupId group;
  std::optional<std::size_t> position;
  std::uint64_t live;
};

class ZTRAIN_API ParamGatherer {
 public:
  // shard: this rank's owned range of the flat parameters, initialised;
  // gathers and views are in its type. Persistent parameters are gathered
  // here (collective).
  ParamGatherer(Device& device, const ParamSpecs& params, const ModuleSpecs& modules,
                const FlatLayout& layout, Communicator& comm, OwnedShard& shard,
                const GatherOptions& options, std::string strategy);
  // Waits for gathers still in the air (their buffers are freed here).
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // A training micro-step starts (trace position 0).
  void begin_micro_step();
  // The micro-steps of this optimizer step are over: everything
  // non-persistent is released.
  void end_step();
  void fetch(ModuleId m, bool backward);
  void release(ModuleId m, bool backward);
  TensorView view(ParamId p) const;
  // Re-gathers the persistent parameters from the shard (collective).
  void refresh();
  // The whole value of p in fp32 (collective).
  void read(ParamId p, float* out);

  double wait_seconds() const { return wait_s_; }
  std::uint64_t persistent_elements() const { return persistent_elements_; }
  const GatherGroups& groups() const { return groups_; }
  const GatherPlan* plan() const { return recorded_ ? &plan_ : nullptr; }
  void record_events(std::vector<GatherEvent>* log) { log_ = log; }

 private:
  enum class State : std::uint8_t { released, in_flight, live };
  struct Live {
    std::vector<std::size_t> counts;  // owned elements per rank
    State state = State::released;
    Buffer buffer;
    ShardLoan send;  // this rank's part, while the gather is in flight
    CommWork work;
  };
  struct Param {
    std::uint64_t offset, numel;
    std::optional<GroupId> group;  // none: persistent
    Shape shape;
  };
  // This rank's part of the flat range [begin, end), lent by the shard
  // (nothing when it owns none of it).
  ShardLoan own_part(std::uint64_t begin, std::uint64_t end);
  std::size_t bytes(std::uint64_t elements) const { return elements * dtype_size(dtype_); }
  void gather(GroupId g);
  void wait(GroupId g);
  void drop(GroupId g);
  void end_micro_step();
  void release_all();
  void log(GatherEvent::Kind kind, GroupId g);
  std::string describe(const TraceEntry& e) const;
  void build_persistent();

  Device& device_;
  Communicator& comm_;
  const FlatLayout& layout_;
  OwnedShard& shard_;
  DType dtype_;
  GatherOptions options_;
  std::string strategy_;
  IdVector<ParamId, Param> params_;
  GatherGroups groups_;
  IdVector<GroupId, Live> live_groups_;
  IdVector<ModuleId, std::string> module_names_;
  GroupNeeds needs_;
  // Persistent parameters, whole, one after another in `persistent_`;
  // refresh() gathers every rank's owned pieces of them, packed.
  struct Piece {
    ParamId param;
    std::uint64_t begin, end;  // flat
  };
  IdVector<ParamId, std::uint64_t> persistent_at_;  // offset in persistent_
  std::vector<Piece> pieces_;                       // owned pieces, rank by rank
  std::vector<std::size_t> piece_counts_;           // packed elements per rank
  Buffer persistent_;
  std::vector<TraceEntry> trace_;
  GatherPlan plan_;
  bool recorded_ = false, training_ = false;
  std::size_t position_ = 0;
  std::uint64_t live_ = 0, persistent_elements_ = 0;
  double wait_s_ = 0;
  std::vector<GatherEvent>* log_ = nullptr;
  std::deque<GroupId> reading_;  // gathers holding a read buffer, oldest first
};

}  // namespace ztrain::shard
