// ShardGradReducer: gradients averaged over ranks into this rank's shard.
//
// The gradient side of zero1, zero2 and zero3. The flat gradient range is
// cut into buckets (reverse_buckets); each bucket is reduced by one
// irregular reduce-scatter, so the part of it rank r owns arrives, averaged
// over the ranks, in rank r's shard of gradients.
//
// Two storage modes:
// - staged (zero2, zero3; `full` is null): a bucket's buffer exists only
//   from backward's first request for a gradient in it (zeroed then) until
//   its reduction has finished. Every micro-step reduces and the shard
//   accumulates (+=), as DeepSpeed's stage 2 does. Buckets launch, in bucket
//   order, as soon as a module's backward completes them; with `overlap`
//   each reduction runs during the next module's backward and is waited for
//   (its buffers freed) when that one is done, without it each is waited
//   for at once.
// - full (zero1): buckets are views of the caller's whole gradient buffer,
//   reduced at finish(), two in the air at a time (one without `overlap`);
//   the shard, the owned part of that same buffer, is overwritten with the
//   average.
// Buckets, the shard and the reductions all use the shard's type (the run's
// grad_accum_dtype).
// Every rank issues the same collectives in the same order, and the memory
// trace does not depend on timing, so simulate() reproduces its peaks.
//
// Ownership: bucket buffers are (device, grads), receive buffers (device,
// comm); `shard` and `full` belong to the caller and must outlive this.
// Errors: InternalError when a gradient is requested after its bucket was
// reduced (a model whose used_by lists miss a module); CommError.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/tensor.h"

namespace ztrain::shard {

struct ReduceSettings {
  std::uint64_t bucket_elements = 1000000;
  std::uint64_t first_bucket_elements = 1 << 18;
  bool overlap = true;
};

// Peak transient memory of a reducer, in elements.
struct ReducePeaks {
  std::uint64_t staged = 0;  // bucket buffers (grads)
  std::uint64_t recv = 0;    // receive buffers (comm)
};

class ZTRAIN_API ShardGradReducer {
 public:
  // shard: this rank's owned range of the flat gradients (layout.owned_*).
  ShardGradReducer(Device& device, const std::vector<ParamSpec>& params, const FlatLayout& layout,
                   Communicator& comm, TypedPtr shard, const ReduceSettings& settings,
                   TypedPtr full = {});
  // Waits for reductions still in the air (their buffers are freed here).
  ~ShardGradReducer();
  ShardGradReducer(const ShardGradReducer&) = delete;
  ShardGradReducer& operator=(const ShardGradReducer&) = delete;

  // Staged mode: the gradient of p inside its bucket buffer.
  TensorView grad(ParamId p);
  // A micro-step starts: what the previous one left in the air is finished.
  void begin_micro_step();
  // After module m's backward: staged buckets it completed are launched.
  void module_done(ModuleId m);
  // Launches what is left and waits for everything: the shard holds the
  // averaged gradients.
  void finish();

  // Seconds spent waiting for reductions, since setup.
  double wait_seconds() const { return wait_s_; }
  ReducePeaks peaks() const { return peaks_; }

  // The peaks of one micro-step of backward (modules last to first, each
  // asking for the gradients of the parameters it uses) on `rank`.
  static ReducePeaks simulate(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                              int rank, const ReduceSettings& settings, bool full);
  // The largest of simulate's peaks over the layout's ranks (what an
  // estimate per rank must cover).
  static ReducePeaks simulate_worst(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                                    const ReduceSettings& settings, bool full);

 private:
  enum class State : std::uint8_t { idle, open, launched };
  struct Bucket {
    std::uint64_t begin, end;
    int params, pending;
    State state = State::idle;
    std::vector<std::size_t> counts;  // owned elements per rank
    std::uint64_t own_begin = 0;      // flat start of this rank's part
    Buffer staging, recv;
    CommWork work;
  };
  // Dry: no device or communicator, only the memory counters move.
  ShardGradReducer(const std::vector<ParamSpec>& params, const FlatLayout& layout, int rank,
                   const ReduceSettings& settings, bool full);
  void build(const std::vector<ParamSpec>& params);
  void* open(Bucket& b);
  void launch(std::size_t i);
  void complete(std::size_t i);
  void launch_rest_and_wait();
  std::uint64_t own(const Bucket& b) const { return b.counts[static_cast<std::size_t>(rank_)]; }

  Device* device_ = nullptr;
  Communicator* comm_ = nullptr;
  const FlatLayout& layout_;
  int rank_ = 0;
  TypedPtr shard_, full_;
  bool staged_;
  ReduceSettings settings_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  std::vector<Shape> shapes_;
  std::vector<std::vector<ParamId>> completes_;
  std::deque<std::size_t> in_flight_;
  bool active_ = false;
  std::uint64_t staged_now_ = 0, recv_now_ = 0;
  ReducePeaks peaks_;
  double wait_s_ = 0;
};

}  // namespace ztrain::shard
