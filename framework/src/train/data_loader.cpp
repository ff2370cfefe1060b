#include "train/data_loader.h"

#include <algorithm>
#include <string>

#include "ztrain/error.h"

namespace ztrain {

DataLoader::DataLoader(const DataSource& source, int micro_batch, int seq_len, int grad_accum,
                       DataShare share)
    : source_(source),
      B_(micro_batch),
      T_(seq_len),
      A_(grad_accum),
      share_(share),
      masks_(false),
      segments_(false) {
  const DataInfo info = source.info();
  masks_ = info.masks;
  segments_ = info.segments;
  if (segments_ && share_.split.shards() > 1)
    throw InternalError("a data source with segments read in sequence shards");
  for (auto* s : {&slots_[0], &slots_[1], &val_slot_}) *s = make_slot();
  start_prefetch();
}

DataLoader::Slot DataLoader::make_slot() const {
  const auto n = static_cast<std::size_t>(micro_tokens());
  Slot s;
  s.inputs.resize(n);
  s.targets.resize(n);
  if (segments_) s.positions.resize(n);
  if (share_.split.shards() > 1) {
    s.row_inputs.resize(static_cast<std::size_t>(T_));
    s.row_targets.resize(static_cast<std::size_t>(T_));
  }
  return s;
}

DataLoader::~DataLoader() {
  if (pending_.valid()) pending_.wait();
}

// Whole rows go straight into the slot; a shard's tokens are cut from the
// row read beside it.
void DataLoader::fill_rows(Split split, std::uint64_t first, Slot& slot) const {
  const bool sliced = share_.split.shards() > 1;
  const std::size_t width = static_cast<std::size_t>(T_ / share_.split.shards());
  const std::vector<TokenSpan> spans = shard_spans(share_.split, width, share_.shard);
  for (int b = 0; b < B_; ++b) {
    const std::size_t to = width * static_cast<std::size_t>(b);
    std::int32_t* inputs = sliced ? slot.row_inputs.data() : slot.inputs.data() + to;
    std::int32_t* targets = sliced ? slot.row_targets.data() : slot.targets.data() + to;
    source_.fill(split, first + static_cast<std::uint64_t>(b), inputs, targets);
    if (segments_)
      fill_positions(split, first + static_cast<std::uint64_t>(b), slot.positions.data() + to);
    if (!masks_) {
      const std::size_t width_read = sliced ? static_cast<std::size_t>(T_) : width;
      const std::int32_t* ignored = std::find(targets, targets + width_read, kIgnoreTarget);
      if (ignored != targets + width_read)
        throw DataError("the data source gave sequence " + std::to_string(first + b) +
                        " an ignored target (-100) at position " +
                        std::to_string(ignored - targets) +
                        " without declaring masks (DataInfo::masks): its loss would be "
                        "normalised over tokens it skips; fix the data plugin");
    }
    if (!sliced) continue;
    for (const TokenSpan& s : spans) {
      std::copy_n(slot.row_inputs.data() + s.position, s.length, slot.inputs.data() + to + s.row);
      std::copy_n(slot.row_targets.data() + s.position, s.length, slot.targets.data() + to + s.row);
    }
  }
}

void DataLoader::fill_positions(Split split, std::uint64_t index, std::int32_t* positions) const {
  source_.fill_positions(split, index, positions);
  for (int t = 0; t < T_; ++t) {
    const std::int32_t p = positions[t];
    if (p == 0 || (t > 0 && p == positions[t - 1] + 1)) continue;
    throw DataError("the data source gave sequence " + std::to_string(index) + " position " +
                    std::to_string(p) + " at token " + std::to_string(t) + " (after " +
                    (t > 0 ? std::to_string(positions[t - 1]) : std::string("none")) +
                    "): a row's positions start at 0 and either restart at 0 (a new example) "
                    "or count on by one; fix the data plugin");
  }
}

void DataLoader::fill_train(std::uint64_t micro_step, Slot& slot) const {
  const std::uint64_t step = micro_step / static_cast<std::uint64_t>(A_);
  const std::uint64_t a = micro_step % static_cast<std::uint64_t>(A_);
  const std::uint64_t G = static_cast<std::uint64_t>(B_) * A_ * share_.ranks;
  fill_rows(Split::train, step * G + (static_cast<std::uint64_t>(share_.rank) * A_ + a) * B_, slot);
}

void DataLoader::start_prefetch() {
  Slot& slot = slots_[current_];
  const std::uint64_t micro_step = position_;
  pending_ =
      std::async(std::launch::async, [this, &slot, micro_step] { fill_train(micro_step, slot); });
}

std::uint64_t DataLoader::step_targets() const {
  if (!masks_) return micro_tokens() * static_cast<std::uint64_t>(A_);
  Slot slot = make_slot();
  std::uint64_t n = 0;
  for (int a = 0; a < A_; ++a) {
    fill_train(position_ + static_cast<std::uint64_t>(a), slot);
    n += trained(batch_of(slot));
  }
  return n;
}

std::uint64_t DataLoader::trained(const Batch& batch) {
  const std::size_t n =
      static_cast<std::size_t>(batch.shape.batch) * static_cast<std::size_t>(batch.shape.seq_len);
  return static_cast<std::uint64_t>(
      n - static_cast<std::size_t>(std::count(batch.targets, batch.targets + n, kIgnoreTarget)));
}

Batch DataLoader::batch_of(const Slot& slot) const {
  return {{B_, T_ / share_.split.shards(), share_.split},
          slot.inputs.data(),
          slot.targets.data(),
          segments_ ? slot.positions.data() : nullptr};
}

Batch DataLoader::next() {
  if (!pending_.valid()) start_prefetch();  // the last prefetch failed and was reported
  pending_.get();                           // rethrows a DataError from the worker
  const int ready = current_;
  current_ ^= 1;
  ++position_;
  start_prefetch();
  return batch_of(slots_[ready]);
}

Batch DataLoader::val(std::int64_t j) {
  fill_rows(
      Split::val,
      (static_cast<std::uint64_t>(j) * share_.ranks + static_cast<std::uint64_t>(share_.rank)) * B_,
      val_slot_);
  return batch_of(val_slot_);
}

void DataLoader::seek(std::uint64_t micro_steps) {
  if (pending_.valid()) pending_.wait();
  position_ = micro_steps;
  start_prefetch();
}

}  // namespace ztrain
