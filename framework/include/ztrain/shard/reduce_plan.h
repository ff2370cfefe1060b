// ReducePlan: how a strategy's gradients are reduced across ranks, as data.
//
// The flat gradient range is cut into buckets (reverse_buckets: from the end
// of the layout backwards, ending at module boundaries). For every bucket
// the plan says what it holds (its flat range), how it is reduced (an
// all-reduce that leaves the average everywhere, or a reduce-scatter that
// leaves each rank the average of the part it owns), where the gradients
// wait to be reduced (the caller's full gradient buffer, or a staging
// buffer of its own that exists from the first backward write into it
// until its reduction finished), and where the result lands (in place, or
// into the caller's gradient shard, added or overwriting). And it says when
// each bucket is launched and waited for: after which module's backward,
// or at the end of the micro-step, separately for micro-steps that
// accumulate and for the last one of a step.
//
// GradReducer executes a plan; reduce_peaks and worst_reduce_peaks read the
// same plan, so an estimate predicts the transient buffers a run allocates. The
// policies a built-in strategy picks from:
// - replicate (ddp): all-reduce in place in the full buffer, during the
//   last micro-step's backward as modules complete buckets; accumulating
//   micro-steps reduce nothing.
// - shard_after_backward (zero1): reduce-scatter the full buffer after the
//   last micro-step's backward, `overlap` ? 2 : 1 buckets in the air; the
//   owner's part overwrites its shard (the owned part of the same buffer).
// - shard_during_backward (zero2, zero3, the offload strategies): every
//   micro-step's gradients exist only in staging buffers, reduce-scattered
//   as backward completes them and added into the shard (which accumulates
//   the micro-steps). With `overlap` a reduction is waited for after the
//   next module's backward, else at once.
//
// Thread safety: immutable values; the functions are pure.
#pragma once

#include <cstdint>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/export.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"

namespace ztrain::shard {

struct ReduceSettings {
  std::uint64_t bucket_elements = 1000000;
  std::uint64_t first_bucket_elements = 1 << 18;  // communication starts early
  bool overlap = true;
};

enum class ReducePolicy : std::uint8_t { replicate, shard_after_backward, shard_during_backward };

// Where a reduced bucket lands.
enum class Landing : std::uint8_t {
  in_place,  // the full buffer holds the average (all-reduce)
  // Into the owner's gradient shard: written over it in a step's first
  // micro-step (so the optimizer need not zero the shard after stepping),
  // added into it in the later ones.
  shard_accumulate,
  shard_write,  // written over the owner's gradient shard
};

struct ReduceBucket {
  Span range;      // flat elements
  int params = 0;  // parameters that start in the range
  Collective collective = Collective::all_reduce;
  std::vector<std::size_t> counts;  // reduce-scatter: elements each rank owns
  bool staged = false;              // in a buffer of its own, else a view of the full buffer
  ModuleId first_use{};             // staged: the module whose backward writes it first
  Landing landing = Landing::in_place;
};

struct ReduceAction {
  enum class Kind : std::uint8_t { launch, wait };
  Kind kind;
  BucketId bucket;
  bool operator==(const ReduceAction&) const = default;
};

// What one micro-step does: after_module[m] runs when module m's backward
// is done (backward visits modules from the last to the first); at_end
// after that (for the last micro-step: in finish()).
struct ReduceSchedule {
  IdVector<ModuleId, std::vector<ReduceAction>> after_module;
  std::vector<ReduceAction> at_end;
  // No action anywhere (ddp's and zero1's accumulating micro-steps).
  bool empty() const {
    for (const auto& actions : after_module)
      if (!actions.empty()) return false;
    return at_end.empty();
  }
};

struct ReducePlan {
  IdVector<BucketId, ReduceBucket> buckets;
  IdVector<ParamId, BucketId> bucket_of;
  ReduceSchedule accumulating, last;
};

ZTRAIN_API ReducePlan make_reduce_plan(const ParamSpecs& params, const FlatLayout& layout,
                                       ReducePolicy policy, const ReduceSettings& settings);

// Transient elements a plan holds at once on `rank` during one micro-step
// (the larger of the two schedules): staging buffers (category grads) and
// the receive buffers of reduce-scatters (category comm).
struct ReducePeaks {
  std::uint64_t staged = 0;
  std::uint64_t recv = 0;
};
ZTRAIN_API ReducePeaks reduce_peaks(const ReducePlan& plan, int rank);
// The largest over the layout's ranks (what an estimate per rank covers).
ZTRAIN_API ReducePeaks worst_reduce_peaks(const ReducePlan& plan, int world);

}  // namespace ztrain::shard
