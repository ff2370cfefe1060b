#include "ztrain/shard/grad_reducer.h"

#include <algorithm>

namespace ztrain::shard {

GradReducer::GradReducer(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                         TypedPtr grads, Communicator& comm, std::uint64_t bucket_elements,
                         std::uint64_t first_bucket_elements)
    : grads_(grads), comm_(comm) {
  std::vector<int> bucket_of;
  for (const auto& b :
       reverse_buckets(layout, params, bucket_elements, first_bucket_elements, bucket_of))
    buckets_.push_back({b.begin, b.end, b.params, b.params, false, {}});
  for (const auto& done : completed_by_module(params)) {
    completes_.emplace_back();
    for (ParamId p : done) completes_.back().push_back(bucket_of[static_cast<std::size_t>(p)]);
  }
}

GradReducer::~GradReducer() {
  for (auto& b : buckets_) {
    try {
      b.work.wait();
    } catch (...) {  // an error on the way out: grads must outlive the collective anyway
    }
  }
}

void GradReducer::launch(Bucket& b) {
  b.launched = true;
  const std::uint64_t n = b.end - b.begin;
  if (comm_.size() > 1) {
    b.work = comm_.all_reduce_async(grads_.at(b.begin).data, n, grads_.dtype, ReduceOp::average);
  }
}

void GradReducer::begin_micro_step(bool sync) {
  sync_ = sync;
  for (auto& b : buckets_) b.pending = b.params;
}

void GradReducer::module_done(ModuleId m) {
  if (static_cast<std::size_t>(m) >= completes_.size()) return;
  for (int b : completes_[static_cast<std::size_t>(m)])
    --buckets_[static_cast<std::size_t>(b)].pending;
  if (!sync_) return;
  // Launch in bucket order only, so every rank issues the same sequence.
  for (auto& b : buckets_) {
    if (b.launched) continue;
    if (b.pending > 0) break;
    launch(b);
  }
}

void GradReducer::finish() {
  for (auto& b : buckets_)
    if (!b.launched) launch(b);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_) {
    b.work.wait();
    b.work = {};
    b.launched = false;
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ztrain::shard
