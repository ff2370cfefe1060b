#include "ztrain/shard/grad_reducer.h"

#include <algorithm>

namespace ztrain::shard {

GradReducer::GradReducer(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                         float* grads, Communicator& comm, std::uint64_t bucket_bytes,
                         std::uint64_t first_bucket_bytes)
    : grads_(grads), comm_(comm) {
  // Walk parameters from the end of the layout, cutting a bucket whenever
  // it reaches its size; the last bucket also takes the layout's start.
  std::uint64_t end = layout.total();
  std::uint64_t limit = std::max<std::uint64_t>(1, first_bucket_bytes / sizeof(float));
  std::vector<int> bucket_of(params.size(), 0);
  int count_in_bucket = 0;
  for (std::size_t i = params.size(); i-- > 0;) {
    const auto id = static_cast<ParamId>(i);
    bucket_of[i] = static_cast<int>(buckets_.size());
    ++count_in_bucket;
    const std::uint64_t begin = layout.offset(id);
    if (end - begin >= limit || i == 0) {
      buckets_.push_back({i == 0 ? 0 : begin, end, count_in_bucket, count_in_bucket, false, {}});
      end = begin;
      count_in_bucket = 0;
      limit = std::max<std::uint64_t>(1, bucket_bytes / sizeof(float));
    }
  }
  // A parameter is complete after the backward of the smallest module using
  // it (backward runs from the last module to the first).
  int modules = 0;
  for (const auto& p : params)
    for (auto m : p.used_by) modules = std::max(modules, m + 1);
  completes_.assign(static_cast<std::size_t>(modules), {});
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& used = params[i].used_by;
    const ModuleId last = used.empty() ? 0 : *std::min_element(used.begin(), used.end());
    completes_[static_cast<std::size_t>(last)].push_back(bucket_of[i]);
  }
}

void GradReducer::launch(Bucket& b) {
  b.launched = true;
  const std::uint64_t n = b.end - b.begin;
  if (comm_.size() > 1) {
    b.work = comm_.all_reduce_async(grads_ + b.begin, n, DType::f32, ReduceOp::average);
    bytes_sent_ += 2 * n * sizeof(float) * static_cast<std::uint64_t>(comm_.size() - 1) /
                   static_cast<std::uint64_t>(comm_.size());
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
