// The executor of a ReducePlan. Each bucket cycles idle -> open -> launched
// -> idle: a staged bucket gets its staging buffer when backward first asks
// for a gradient in it (open), the plan's launch action issues its
// collective on that buffer or on its range of the full buffer
// (launched), and the plan's wait action waits for it, lands the rank's
// part and frees what it held (idle). Backward must not write into a
// launched bucket: grad() refuses, naming the parameter, since that means
// a module missing from a used_by list.
//
// Landing: a reduce-scatter leaves the rank's part in a receive buffer,
// which is written into the gradient shard, piece by piece (a shard may
// lie in several tiers). The landings of a step's first micro-step
// overwrite the shard (it holds the last step's sums); an accumulating
// plan's later micro-steps add theirs, after the earlier copies are done. A device piece is copied
// in order with the kernels; a host piece by an asynchronous copy, whose receive buffer is kept in
// pending_ until the copy is done. At most the newest bucket's copies stay running, so the receive
// buffers stay within the plan's peak (reduce_peaks) plus one bucket's part, which the estimate
// accounts for.
//
// The plan's schedules run from module_done (after each module's backward,
// in reverse module order, checked) and close_micro_step (the modules a
// shortened backward skipped, then the schedule's end actions).
#include "ztrain/shard/grad_reducer.h"

#include <chrono>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {

GradReducer::GradReducer(Device& device, const ParamSpecs& params, const FlatLayout& layout,
                         Communicator& comm, ReducePlan plan, DType dtype, TypedPtr full,
                         std::vector<GradPiece> shard, std::string strategy)
    : device_(device),
      comm_(comm),
      layout_(layout),
      plan_(std::move(plan)),
      dtype_(dtype),
      full_(full),
      shard_(std::move(shard)),
      strategy_(std::move(strategy)),
      live_(plan_.buckets.size()) {
  // A reduce-scatter needs the layout's shards to be the communicator's.
  for (const auto& b : plan_.buckets)
    if (!b.counts.empty() && b.counts.size() != static_cast<std::size_t>(comm.size()))
      throw InternalError(strategy_ + ": gradient shards for " + std::to_string(b.counts.size()) +
                          " ranks, on a communicator of " + std::to_string(comm.size()));
  for (const auto& p : params) shapes_.push_back(p.shape);
}

GradReducer::~GradReducer() {
  for (auto& l : live_) {
    if (l.state != State::launched) continue;
    try {
      l.work.wait();
    } catch (...) {  // an error on the way out: the buffers must outlive the collective anyway
    }
  }
}

void* GradReducer::open(BucketId b) {
  const std::size_t bytes =
      (plan_.buckets[b].range.end - plan_.buckets[b].range.begin) * dtype_size(dtype_);
  live_[b].staging = device_.allocate(Tier::device, Category::grads, bytes);
  live_[b].state = State::open;
  return live_[b].staging.data();
}

TensorView GradReducer::grad(ParamId p) {
  const BucketId b = plan_.bucket_of[p];
  const ReduceBucket& bucket = plan_.buckets[b];
  const Shape& shape = shapes_[p];
  if (!bucket.staged) return {full_.at(layout_.offset(p)).data, dtype_, shape};
  if (live_[b].state == State::launched)
    throw InternalError(strategy_ + ": gradient of parameter " + to_string(p) +
                        " requested after its bucket was reduced: a module using it is missing "
                        "from its used_by list");
  void* base = live_[b].state == State::open ? live_[b].staging.data() : open(b);
  const TypedPtr at{base, dtype_};
  return {at.at(layout_.offset(p) - bucket.range.begin).data, dtype_, shape};
}

void GradReducer::launch(BucketId b) {
  const ReduceBucket& bucket = plan_.buckets[b];
  Live& l = live_[b];
  void* src = !bucket.staged           ? full_.at(bucket.range.begin).data
              : l.state == State::open ? l.staging.data()
                                       : open(b);
  const std::uint64_t n = bucket.range.end - bucket.range.begin;
  if (bucket.collective == Collective::all_reduce) {
    l.work = comm_.all_reduce_async(src, n, dtype_, ReduceOp::average);
  } else {
    const std::size_t own = bucket.counts[static_cast<std::size_t>(comm_.rank())];
    l.recv = device_.allocate(Tier::device, Category::comm, own * dtype_size(dtype_));
    l.work =
        comm_.reduce_scatter_v_async(src, l.recv.data(), bucket.counts, dtype_, ReduceOp::average);
  }
  l.state = State::launched;
}

void GradReducer::wait(BucketId b) {
  const ReduceBucket& bucket = plan_.buckets[b];
  Live& l = live_[b];
  const auto t0 = std::chrono::steady_clock::now();
  l.work.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  l.work = {};
  const std::size_t own =
      bucket.counts.empty() ? 0 : bucket.counts[static_cast<std::size_t>(comm_.rank())];
  PendingLanding landing;
  if (own > 0 && bucket.landing != Landing::in_place) {
    const std::uint64_t from = std::max(bucket.range.begin, layout_.owned_begin(comm_.rank()));
    const TypedPtr got{l.recv.data(), dtype_};
    const bool adds = bucket.landing == Landing::shard_accumulate && !first_;
    if (adds) reap(true);  // the step's first landing may still be copying into the shard
    for (const GradPiece& piece : shard_) {
      const std::uint64_t lo = std::max(from, piece.begin), hi = std::min(from + own, piece.end);
      if (lo >= hi) continue;
      void* dst = piece.data.at(lo - piece.begin).data;
      const std::size_t bytes = (hi - lo) * dtype_size(dtype_);
      if (adds)
        device_.accumulate({dst, dtype_}, got.at(lo - from), hi - lo);
      else if (piece.tier == Tier::device)
        device_.copy(dst, got.at(lo - from).data, bytes);  // in order with the kernels
      else
        landing.copies.push_back(device_.copy_async(dst, got.at(lo - from).data, bytes));
    }
  }
  landing.recv = std::move(l.recv);
  pending_.push_back(std::move(landing));
  reap(false);
  // At most the newest bucket's copies left running: the receive buffers
  // stay within one bucket's part of the plan's.
  while (pending_.size() > 1) {
    for (CopyWork& c : pending_.front().copies) c.wait();
    pending_.erase(pending_.begin());
  }
  l.staging.reset();
  l.state = State::idle;
}

void GradReducer::reap(bool all) {
  std::erase_if(pending_, [all](PendingLanding& landing) {
    for (CopyWork& c : landing.copies) {
      if (!all && !c.done()) return false;
      c.wait();
    }
    return true;
  });
}

void GradReducer::run(const std::vector<ReduceAction>& actions) {
  for (const auto& a : actions) {
    if (a.kind == ReduceAction::Kind::launch)
      launch(a.bucket);
    else
      wait(a.bucket);
  }
}

void GradReducer::begin_micro_step(bool last) {
  close_micro_step();
  schedule_ = last ? &plan_.last : &plan_.accumulating;
  schedule_runs_nothing_ = schedule_->empty();
  due_ = schedule_->after_module.size();
}

void GradReducer::module_done(ModuleId m) {
  if (!schedule_ || schedule_runs_nothing_ || !schedule_->after_module.contains(m)) return;
  if (index_of(m) + 1 != due_)
    throw InternalError(strategy_ + ": backward ran module " + to_string(m) + " where " +
                        (due_ > 0 ? "module " + std::to_string(due_ - 1) : std::string("none")) +
                        " was due; the gradient reduction plan needs modules from the last to "
                        "the first, each once");
  run(schedule_->after_module[m]);
  --due_;
}

void GradReducer::close_micro_step() {
  if (!schedule_) return;
  // A backward that stopped early: the modules it skipped still reduce.
  for (; due_ > 0; --due_) run(schedule_->after_module[id_at<ModuleId>(due_ - 1)]);
  run(schedule_->at_end);
  schedule_ = nullptr;
  first_ = false;
}

void GradReducer::finish() {
  close_micro_step();
  reap(true);
  first_ = true;
}

}  // namespace ztrain::shard
