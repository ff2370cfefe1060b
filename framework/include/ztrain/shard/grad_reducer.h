// GradReducer: gradient buckets reduced across ranks while backward runs.
//
// Buckets are contiguous ranges of the flat gradient buffer (views, no
// copy), filled from the end of the layout backwards, which is the order in
// which backward completes gradients (the head first, the embedding last).
// The first bucket is small so communication starts early; the others hold
// up to `bucket_elements`; buckets are reduced in the gradients' own type.
// When a module's backward completes, every parameter whose last user in
// backward order was that module is complete; a bucket whose parameters are
// all complete is launched asynchronously (all-reduce average), in the same
// order on every rank. finish() launches what is left and waits. Every
// micro-step starts with begin_micro_step(last); during gradient
// accumulation nothing is launched before the last one.
//
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"

namespace ztrain::shard {

class ZTRAIN_API GradReducer {
 public:
  GradReducer(const std::vector<ParamSpec>& params, const FlatLayout& layout, TypedPtr grads,
              Communicator& comm, std::uint64_t bucket_elements,
              std::uint64_t first_bucket_elements);
  // Waits for buckets still in the air (they write into `grads`).
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Resets the completion counts; `sync` false holds every bucket back
  // (accumulation micro-steps before the last).
  void begin_micro_step(bool sync);
  // After module m's backward: launch every bucket that became complete.
  void module_done(ModuleId m);
  // Launches the remaining buckets and waits for all of them.
  void finish();

  std::size_t bucket_count() const { return buckets_.size(); }
  // Seconds waited in finish(), since construction.
  double wait_seconds() const { return wait_s_; }

 private:
  struct Bucket {
    std::uint64_t begin, end;  // flat element range
    int pending;               // parameters not yet complete this step
    int params;
    bool launched;
    CommWork work;
  };
  void launch(Bucket& b);

  TypedPtr grads_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> completes_;  // per module: buckets of the params it completes
  bool sync_ = true;
  double wait_s_ = 0;
};

}  // namespace ztrain::shard
