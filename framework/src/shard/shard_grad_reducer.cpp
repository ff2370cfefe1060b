#include "ztrain/shard/shard_grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ztrain/error.h"

namespace ztrain::shard {

ShardGradReducer::ShardGradReducer(Device& device, const std::vector<ParamSpec>& params,
                                   const FlatLayout& layout, Communicator& comm, TypedPtr shard,
                                   const ReduceSettings& settings, TypedPtr full)
    : device_(&device),
      comm_(&comm),
      layout_(layout),
      rank_(comm.rank()),
      shard_(shard),
      full_(full),
      staged_(!full),
      settings_(settings) {
  if (comm.size() != layout.world())
    throw InternalError("ShardGradReducer: layout for " + std::to_string(layout.world()) +
                        " ranks, communicator of " + std::to_string(comm.size()));
  build(params);
}

ShardGradReducer::ShardGradReducer(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                                   int rank, const ReduceSettings& settings, bool full)
    : layout_(layout), rank_(rank), staged_(!full), settings_(settings) {
  build(params);
}

ShardGradReducer::~ShardGradReducer() {
  for (std::size_t i : in_flight_) {
    try {
      buckets_[i].work.wait();
    } catch (...) {  // an error on the way out: the buffers must outlive the collective anyway
    }
  }
}

void ShardGradReducer::build(const std::vector<ParamSpec>& params) {
  for (const auto& r : reverse_buckets(
           layout_, params, settings_.bucket_elements,
           std::min(settings_.bucket_elements, settings_.first_bucket_elements), bucket_of_)) {
    Bucket b;
    b.begin = r.begin;
    b.end = r.end;
    b.params = b.pending = r.params;
    b.counts = layout_.owned_counts(r.begin, r.end);
    b.own_begin = std::max(r.begin, layout_.owned_begin(rank_));
    buckets_.push_back(std::move(b));
  }
  completes_ = completed_by_module(params);
  for (const auto& p : params) shapes_.push_back(p.shape);
}

void* ShardGradReducer::open(Bucket& b) {
  b.state = State::open;
  const std::uint64_t n = b.end - b.begin;
  staged_now_ += n;
  peaks_.staged = std::max(peaks_.staged, staged_now_);
  if (!device_) return nullptr;
  const std::size_t bytes = n * dtype_size(shard_.dtype);
  b.staging = device_->allocate(Tier::device, Category::grads, bytes);
  std::memset(b.staging.data(), 0, bytes);
  return b.staging.data();
}

TensorView ShardGradReducer::grad(ParamId p) {
  if (!staged_) throw InternalError("ShardGradReducer::grad in full mode: use the full buffer");
  Bucket& b = buckets_[static_cast<std::size_t>(bucket_of_[static_cast<std::size_t>(p)])];
  if (b.state == State::launched)
    throw InternalError("gradient of parameter " + std::to_string(p) +
                        " requested after its bucket was reduced: a module using it is missing "
                        "from its used_by list");
  void* base = b.state == State::open ? b.staging.data() : open(b);
  active_ = true;
  if (!base) return {};
  const TypedPtr bucket{base, shard_.dtype};
  return {bucket.at(layout_.offset(p) - b.begin).data, shard_.dtype,
          shapes_[static_cast<std::size_t>(p)]};
}

void ShardGradReducer::launch(std::size_t i) {
  Bucket& b = buckets_[i];
  const void* src =
      staged_ ? (b.state == State::open ? b.staging.data() : open(b)) : full_.at(b.begin).data;
  const std::size_t size = dtype_size(shard_.dtype);
  b.state = State::launched;
  const std::uint64_t mine = own(b);
  recv_now_ += mine;
  peaks_.recv = std::max(peaks_.recv, recv_now_);
  in_flight_.push_back(i);
  if (comm_) {
    b.recv = device_->allocate(Tier::device, Category::comm, mine * size);
    b.work = comm_->reduce_scatter_v_async(src, b.recv.data(), b.counts, shard_.dtype,
                                           ReduceOp::average);
  }
  if (!settings_.overlap) complete(i);
}

void ShardGradReducer::complete(std::size_t i) {
  Bucket& b = buckets_[i];
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), i));
  const std::uint64_t mine = own(b);
  if (comm_) {
    const auto t0 = std::chrono::steady_clock::now();
    b.work.wait();
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b.work = {};
    if (mine > 0) {
      const TypedPtr dst = shard_.at(b.own_begin - layout_.owned_begin(rank_));
      if (staged_)
        add_into(dst.data, b.recv.data(), mine, shard_.dtype);
      else
        std::memcpy(dst.data, b.recv.data(), mine * dtype_size(shard_.dtype));
    }
    b.recv.reset();
    b.staging.reset();
  }
  recv_now_ -= mine;
  if (staged_) staged_now_ -= b.end - b.begin;
}

void ShardGradReducer::launch_rest_and_wait() {
  // Two in the air at a time bounds the receive buffers.
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].state == State::launched) continue;
    while (in_flight_.size() >= 2) complete(in_flight_.front());
    launch(i);
  }
  while (!in_flight_.empty()) complete(in_flight_.front());
  for (auto& b : buckets_) {
    b.state = State::idle;
    b.pending = b.params;
  }
  active_ = false;
}

void ShardGradReducer::begin_micro_step() {
  // A micro-step whose backward did not reach module 0 still reduces all
  // of its buckets, so every rank's collective sequence stays aligned.
  if (staged_ && active_) launch_rest_and_wait();
  for (auto& b : buckets_) b.pending = b.params;
}

void ShardGradReducer::module_done(ModuleId m) {
  if (static_cast<std::size_t>(m) >= completes_.size()) return;
  for (ParamId p : completes_[static_cast<std::size_t>(m)])
    --buckets_[static_cast<std::size_t>(bucket_of_[static_cast<std::size_t>(p)])].pending;
  if (!staged_) return;
  active_ = true;
  // What was launched after the previous module has had this module's
  // backward to finish in; its buffers go before new ones are launched.
  while (!in_flight_.empty()) complete(in_flight_.front());
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].state == State::launched) continue;
    if (buckets_[i].pending > 0) break;
    launch(i);
  }
}

void ShardGradReducer::finish() {
  if (staged_ && !active_) return;  // already reduced in begin_micro_step's flush
  launch_rest_and_wait();
}

ReducePeaks ShardGradReducer::simulate(const std::vector<ParamSpec>& params,
                                       const FlatLayout& layout, int rank,
                                       const ReduceSettings& settings, bool full) {
  ShardGradReducer dry(params, layout, rank, settings, full);
  const auto modules = static_cast<ModuleId>(dry.completes_.size());
  dry.begin_micro_step();
  for (ModuleId m = modules; m-- > 0;) {
    if (!full)
      for (std::size_t p = 0; p < params.size(); ++p) {
        const auto& used = params[p].used_by;
        if (std::find(used.begin(), used.end(), m) != used.end()) dry.grad(static_cast<ParamId>(p));
      }
    dry.module_done(m);
  }
  dry.active_ = true;
  dry.finish();
  return dry.peaks_;
}

ReducePeaks ShardGradReducer::simulate_worst(const std::vector<ParamSpec>& params,
                                             const FlatLayout& layout,
                                             const ReduceSettings& settings, bool full) {
  ReducePeaks worst;
  for (int r = 0; r < layout.world(); ++r) {
    const ReducePeaks p = simulate(params, layout, r, settings, full);
    worst.staged = std::max(worst.staged, p.staged);
    worst.recv = std::max(worst.recv, p.recv);
  }
  return worst;
}

}  // namespace ztrain::shard
