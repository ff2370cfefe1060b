#include "train/data_loader.h"

namespace ztrain {

DataLoader::DataLoader(const DataSource& source, int micro_batch, int seq_len, int grad_accum,
                       int rank, int world)
    : source_(source), B_(micro_batch), T_(seq_len), A_(grad_accum), rank_(rank), world_(world) {
  const std::size_t n = static_cast<std::size_t>(B_) * T_;
  for (auto* s : {&slots_[0], &slots_[1], &val_slot_}) {
    s->inputs.resize(n);
    s->targets.resize(n);
  }
  start_prefetch();
}

DataLoader::~DataLoader() {
  if (pending_.valid()) pending_.wait();
}

void DataLoader::fill_train(std::uint64_t micro_step, Slot& slot) const {
  const std::uint64_t step = micro_step / static_cast<std::uint64_t>(A_);
  const std::uint64_t a = micro_step % static_cast<std::uint64_t>(A_);
  const std::uint64_t G = static_cast<std::uint64_t>(B_) * A_ * world_;
  const std::uint64_t first = step * G + (static_cast<std::uint64_t>(rank_) * A_ + a) * B_;
  for (int b = 0; b < B_; ++b)
    source_.fill(Split::train, first + static_cast<std::uint64_t>(b),
                 slot.inputs.data() + static_cast<std::size_t>(b) * T_,
                 slot.targets.data() + static_cast<std::size_t>(b) * T_);
}

void DataLoader::start_prefetch() {
  Slot& slot = slots_[current_];
  const std::uint64_t micro_step = position_;
  pending_ =
      std::async(std::launch::async, [this, &slot, micro_step] { fill_train(micro_step, slot); });
}

Batch DataLoader::next() {
  if (!pending_.valid()) start_prefetch();  // the last prefetch failed and was reported
  pending_.get();                           // rethrows a DataError from the worker
  const int ready = current_;
  current_ ^= 1;
  ++position_;
  start_prefetch();
  return {{B_, T_}, slots_[ready].inputs.data(), slots_[ready].targets.data()};
}

Batch DataLoader::val(std::int64_t j) {
  const std::uint64_t first =
      (static_cast<std::uint64_t>(j) * world_ + static_cast<std::uint64_t>(rank_)) * B_;
  for (int b = 0; b < B_; ++b)
    source_.fill(Split::val, first + static_cast<std::uint64_t>(b),
                 val_slot_.inputs.data() + static_cast<std::size_t>(b) * T_,
                 val_slot_.targets.data() + static_cast<std::size_t>(b) * T_);
  return {{B_, T_}, val_slot_.inputs.data(), val_slot_.targets.data()};
}

void DataLoader::seek(std::uint64_t micro_steps) {
  if (pending_.valid()) pending_.wait();
  position_ = micro_steps;
  start_prefetch();
}

}  // namespace ztrain
