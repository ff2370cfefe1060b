// GradReducer: executes a ReducePlan (reduce_plan.h) while backward runs.
//
// The model asks for gradient views (grad): a staged bucket's buffer is
// allocated and zeroed at the first request, others are views of the
// caller's full gradient buffer. After each module's backward
// (module_done) the reducer runs the plan's actions for that module:
// launching buckets (all-reduce in place, or an irregular reduce-scatter
// into a receive buffer) and waiting for them (the received average is
// written over the caller's gradient shard, or, for an accumulating
// landing after the step's first micro-step, added into it; then the
// bucket's buffers are freed; the shard may be split into pieces that
// live in different tiers, as an offloaded optimizer's is). At the end of
// a micro-step it runs the
// schedule's closing actions: for accumulating micro-steps at the next
// begin_micro_step, for the last one in finish(), after which the full
// buffer or the shard holds the averaged gradients. A landing that writes
// a piece in host memory is an asynchronous copy (Device::copy_async): on
// a GPU it runs on the copy stream beside the rest of backward (an
// offloaded shard fills over PCIe while later modules compute); its
// bucket's receive buffer is freed once the copy is done, and at most one
// bucket's copies are left running when the next lands, so receive
// buffers exceed the plan's by one bucket's part at most (on a GPU, and
// ZeroStrategy's estimate counts it; the cpu device's copies finish at
// once). finish() and any adding landing wait for them first. A micro-step whose
// backward stopped before module 0 still runs the actions of the modules
// it skipped, so every rank issues the same collectives. A micro-step
// whose schedule runs nothing (ddp's and zero1's accumulating ones) checks
// no order: a pipeline stage's backward runs only its chunk's modules,
// and as often as the schedule says.
//
// Buffers: staging buffers are (device, grads), receive buffers (device,
// comm), in the gradients' dtype. `full` and the shard pieces belong to
// the caller and must outlive the reducer; either may be empty when the
// plan does not use it. Every rank issues the same collectives in the same order, and the
// memory trace is the plan's (but for the copies above), so reduce_peaks()
// predicts it.
//
// Errors: InternalError, naming `strategy`, when backward visits modules
// out of order or asks for a gradient whose bucket is already reduced (a
// model whose used_by lists miss a module); CommError.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/reduce_plan.h"
#include "ztrain/tensor.h"

namespace ztrain::shard {

// Part of a rank's gradient shard: flat elements [begin, end) at `data`,
// memory of `tier` (the reducer copies into host pieces asynchronously).
struct GradPiece {
  std::uint64_t begin, end;
  TypedPtr data;
  Tier tier = Tier::device;
};

class ZTRAIN_API GradReducer {
 public:
  // shard: pieces covering this rank's owned range of the flat gradients
  // (layout.owned_*), in order; dtype: the gradients' type.
  GradReducer(Device& device, const ParamSpecs& params, const FlatLayout& layout,
              Communicator& comm, ReducePlan plan, DType dtype, TypedPtr full,
              std::vector<GradPiece> shard, std::string strategy);
  // Waits for reductions still in the air (their buffers are freed here).
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  TensorView grad(ParamId p);
  // A micro-step starts; `last` is the last of its optimizer step.
  void begin_micro_step(bool last);
  // After module m's backward.
  void module_done(ModuleId m);
  // The step's gradients are reduced: the plan's last closing actions.
  void finish();

  const ReducePlan& plan() const { return plan_; }
  // Seconds spent waiting for reductions, since construction.
  double wait_seconds() const { return wait_s_; }

 private:
  enum class State : std::uint8_t { idle, open, launched };
  struct Live {
    State state = State::idle;
    Buffer staging, recv;
    CommWork work;
  };
  // A bucket's landing copies still running, and the buffer they read
  // (declared first: the copies wait as they are destroyed, before it goes).
  struct PendingLanding {
    Buffer recv;
    std::vector<CopyWork> copies;
  };
  void* open(BucketId b);
  void run(const std::vector<ReduceAction>& actions);
  void launch(BucketId b);
  void wait(BucketId b);
  void close_micro_step();
  // Frees the receive buffers whose copies are done; with `all`, waits for
  // every copy first.
  void reap(bool all);

  Device& device_;
  Communicator& comm_;
  const FlatLayout& layout_;
  ReducePlan plan_;
  DType dtype_;
  TypedPtr full_;
  std::vector<GradPiece> shard_;
  std::string strategy_;
  IdVector<ParamId, Shape> shapes_;
  IdVector<BucketId, Live> live_;
  std::vector<PendingLanding> pending_;
  const ReduceSchedule* schedule_ = nullptr;  // the current micro-step's, null between steps
  bool schedule_runs_nothing_ = false;        // its empty(): no order to check
  // Modules whose backward this micro-step has yet to run: the next is
  // module due_ - 1 (backward runs from the last module to the first).
  std::size_t due_ = 0;
  bool first_ = true;  // this micro-step is its step's first: accumulating landings write
  double wait_s_ = 0;
};

}  // namespace ztrain::shard
