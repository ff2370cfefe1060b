// The step streams sub-groups through B host buffers: sub-group j is read
// into buffer j mod B, which first waits for the writes of the sub-group
// that held it (j - B). Reads are issued B - 1 sub-groups ahead, so while
// sub-group g is stepped the next B - 1 are on their way in and g - 1 is on
// its way out; the last writes are waited for before step() returns, so a
// step's state is on disk when the next begins. Each buffer also holds the
// sub-group's new working copy, written from there to wherever the owned
// shard lives (a copy into memory, or a write to its swap file, in flight
// with the state's); sub-groups start on a page of either file, so those
// writes need no read around them.
#include "ztrain/shard/swapped_optimizer.h"

#include <algorithm>
#include <cstring>

#include "ztrain/error.h"
#include "ztrain/shard/state_ranges.h"
#include "ztrain/shard/swapped_shard.h"

namespace ztrain::shard {
namespace {

std::uint64_t page_aligned(std::uint64_t bytes) {
  return (bytes + AioEngine::kAlign - 1) / AioEngine::kAlign * AioEngine::kAlign;
}

// Sub-group sizes are whole multiples of this many elements, a page in
// every dtype (2 and 4 bytes), so each sub-group starts a page of the
// state's and the working shard's files.
constexpr std::uint64_t kGranule = AioEngine::kAlign / 2;

// The sub-groups' bounds: at most `size` elements each (rounded up to the
// granule), from `begin`.
std::vector<std::pair<std::uint64_t, std::uint64_t>> cut(std::uint64_t begin, std::uint64_t end,
                                                         std::uint64_t size) {
  size = SwappedOptimizer::sub_group_elements(size);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (std::uint64_t b = begin; b < end; b += size) out.emplace_back(b, std::min(end, b + size));
  return out;
}

// A sub-group's host buffer: master, m, v (`stride` bytes each, as in the
// file), then the working copy.
std::uint64_t buffer_bytes(std::uint64_t stride, std::uint64_t elements, DType working) {
  return 3 * stride + page_aligned(elements * dtype_size(working));
}

}  // namespace

std::uint64_t SwappedOptimizer::sub_group_elements(std::uint64_t asked) {
  const std::uint64_t granules =
      std::max<std::uint64_t>(1, asked / kGranule + (asked % kGranule != 0));
  return granules * kGranule;
}

SwappedOptimizer::SwappedOptimizer(Device& device, const ParamSpecs& params,
                                   const FlatLayout& layout, std::uint64_t begin, std::uint64_t end,
                                   const OptimizerSettings& settings, const SwapOptions& swap,
                                   DType grad_dtype, OwnedShard& working, int rank)
    : device_(device),
      begin_(begin),
      end_(end),
      shared_(shared_runs(params, layout, begin, end)),
      settings_(settings),
      grad_dtype_(grad_dtype),
      engine_(swap.aio) {
  std::uint64_t largest = 0;
  for (auto [b, e] : cut(begin, end, swap.sub_group_size)) {
    const std::uint64_t stride = page_aligned((e - b) * sizeof(float));
    groups_.push_back({b, e, file_bytes_, stride, AdamWRange(params, layout, b, e)});
    file_bytes_ += 3 * stride;
    largest = std::max(largest, buffer_bytes(stride, e - b, working.dtype()));
  }
  file_ = engine_.create(swap.dir, "rank" + std::to_string(rank) + ".optimizer", file_bytes_);
  device_.account(Tier::nvme, Category::optimizer, static_cast<std::int64_t>(file_bytes_));
  const auto count = static_cast<std::size_t>(std::max(1, swap.buffer_count));
  for (std::size_t i = 0; i < count && i < std::max<std::size_t>(1, groups_.size()); ++i)
    buffers_.push_back(device.allocate(Tier::host, Category::offload, largest));
  grads_ = device.allocate(Tier::host, Category::grads, (end - begin) * dtype_size(grad_dtype));
  reads_.resize(groups_.size());
  writes_.resize(groups_.size());
  working_writes_.resize(groups_.size());
  // Masters from the working copy (read a slice at a time), moments zero,
  // sub-group by sub-group.
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SubGroup& s = groups_[g];
    std::memset(buffers_[0].data(), 0, 3 * s.stride);
    for (std::uint64_t b = s.begin; b < s.end; b += SwappedShard::kSlice) {
      const std::uint64_t e = std::min(s.end, b + SwappedShard::kSlice);
      const ShardLoan slice = working.lend(b, e);
      device.convert(array(0, s, 0) + (b - s.begin), slice.data, e - b);
    }
    write(g, 0);
    engine_.wait(writes_[g]);
  }
}

SwappedOptimizer::~SwappedOptimizer() {
  if (working_) {
    for (auto& t : working_writes_) {
      try {
        working_->wait(t);
      } catch (...) {  // on the way out after a failure: the file goes anyway
      }
    }
  }
  // Reads still in flight after a failed step land in buffers_, which go
  // before the engine: wait for them too.
  for (auto& t : reads_) {
    try {
      engine_.wait(t);
    } catch (...) {  // on the way out after a failure
    }
  }
  for (auto& t : writes_) {
    try {
      engine_.wait(t);
    } catch (...) {  // on the way out after a failure: the file goes anyway
    }
  }
  device_.account(Tier::nvme, Category::optimizer, -static_cast<std::int64_t>(file_bytes_));
}

float* SwappedOptimizer::array(std::size_t buffer, const SubGroup& g, int which) const {
  return reinterpret_cast<float*>(buffers_[buffer].as<char>() +
                                  static_cast<std::uint64_t>(which) * g.stride);
}

void SwappedOptimizer::read(std::size_t g, std::size_t buffer) {
  const SubGroup& s = groups_[g];
  reads_[g] = engine_.read(file_, s.offset, buffers_[buffer].data(), 3 * s.stride);
}

void SwappedOptimizer::write(std::size_t g, std::size_t buffer) {
  const SubGroup& s = groups_[g];
  writes_[g] = engine_.write(file_, s.offset, buffers_[buffer].data(), 3 * s.stride);
}

std::vector<GradPiece> SwappedOptimizer::grad_pieces() const {
  return {{begin_, end_, {grads_.data(), grad_dtype_}, grads_.tier()}};
}

StepResult SwappedOptimizer::step(OwnedShard& working, Communicator* comm,
                                  const StepKernels& kernels, const StepArgs& args) {
  const TypedPtr grads{grads_.data(), grad_dtype_};
  const StepNorm norm(device_, {{grads, end_ - begin_, Tier::host, shared_}}, comm, kernels, args);
  const StepResult result = norm.result();  // finished on the host: no wait
  if (result.skipped) {
    std::memset(grads_.data(), 0, grads_.bytes());
    return result;
  }
  const std::size_t n = groups_.size(), count = buffers_.size();
  working_ = &working;
  // Reads sub-group j into its buffer once the one before it there is out.
  const auto fetch = [&](std::size_t j) {
    if (j >= n) return;
    if (j >= count) {
      engine_.wait(writes_[j - count]);
      working.wait(working_writes_[j - count]);
    }
    read(j, j % count);
  };
  for (std::size_t j = 0; j + 1 < count; ++j) fetch(j);
  for (std::size_t g = 0; g < n; ++g) {
    fetch(g + count - 1);
    engine_.wait(reads_[g]);
    const SubGroup& s = groups_[g];
    const std::size_t b = g % count;
    const TypedPtr new_working{array(b, s, 3), working.dtype()};
    s.range.step(array(b, s, 0), grads.at(s.begin - begin_), array(b, s, 1), array(b, s, 2),
                 new_working, kernels.host, settings_, args.lr, args.step, norm.on(Tier::host),
                 GradAfter::kept);  // overwritten by the next step's reduction
    write(g, b);
    working_writes_[g] = working.write_async(s.begin, new_working, s.end - s.begin);
  }
  for (auto& t : writes_) engine_.wait(t);
  for (auto& t : working_writes_) working.wait(t);
  return result;
}

void SwappedOptimizer::save(StateSink& sink, const FlatLayout& layout, OwnedShard&) {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SubGroup& s = groups_[g];
    read(g, 0);
    engine_.wait(reads_[g]);
    for (int a = 0; a < 3; ++a)
      put_range(sink, layout, s.begin, s.end, static_cast<StateArray>(a), array(0, s, a));
  }
}

void SwappedOptimizer::load(StateSource& source, const FlatLayout& layout, OwnedShard& working) {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SubGroup& s = groups_[g];
    for (int a = 0; a < 3; ++a)
      get_range(source, layout, s.begin, s.end, static_cast<StateArray>(a), array(0, s, a));
    const TypedPtr new_working{array(0, s, 3), working.dtype()};
    convert(array(0, s, 0), DType::f32, new_working.data, new_working.dtype, s.end - s.begin);
    write(g, 0);
    engine_.wait(writes_[g]);
    working.write(s.begin, new_working, s.end - s.begin);
  }
}

// sub_group_size "auto": a sixteenth of the shard, so reads, steps and
// writes overlap for all but about a sixteenth of the stream (one
// sub-group, DeepSpeed's 1e9 default at the sizes a CPU trains, overlaps
// nothing); at least 2^22 elements (16 MiB per fp32 array: gpt2-124m's
// step was the same within the machine's noise with sub-groups of 2e6
// elements as of 1e9, bench/RESULTS.md); at most DeepSpeed's 1e9; and
// the buffers at most an eighth of the rank's RAM, which wins over the
// floor, since that budget is what the offload is for.
std::uint64_t SwappedOptimizer::auto_sub_group(std::uint64_t elements, int buffer_count,
                                               DType working, std::uint64_t host_budget) {
  constexpr std::uint64_t kFloor = std::uint64_t{1} << 22, kCeiling = 1000000000;
  std::uint64_t size = std::clamp<std::uint64_t>((elements + 15) / 16, kFloor, kCeiling);
  if (host_budget > 0) {
    const std::uint64_t per_element = static_cast<std::uint64_t>(std::max(1, buffer_count)) *
                                      (3 * sizeof(float) + dtype_size(working));
    size = std::min(size, host_budget / 8 / per_element);
  }
  return sub_group_elements(size);
}

MemoryEstimate SwappedOptimizer::estimate(std::uint64_t elements, const SwapOptions& swap,
                                          DType working, DType grad_dtype) {
  std::uint64_t file = 0, largest = 0, groups = 0;
  for (auto [b, e] : cut(0, elements, swap.sub_group_size)) {
    const std::uint64_t stride = page_aligned((e - b) * sizeof(float));
    file += 3 * stride;
    largest = std::max(largest, buffer_bytes(stride, e - b, working));
    ++groups;
  }
  const std::uint64_t buffers =
      std::min<std::uint64_t>(static_cast<std::uint64_t>(std::max(1, swap.buffer_count)),
                              std::max<std::uint64_t>(1, groups));
  return MemoryEstimate()
      .set(Tier::host, Category::grads, elements * dtype_size(grad_dtype))
      .set(Tier::host, Category::offload, buffers * largest)
      .set(Tier::nvme, Category::optimizer, file);
}

}  // namespace ztrain::shard
