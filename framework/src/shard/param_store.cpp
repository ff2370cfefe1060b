#include "ztrain/shard/param_store.h"

#include <chrono>

#include "ztrain/shard/init.h"

namespace ztrain::shard {

ParamStore::~ParamStore() = default;

ReplicatedParams::ReplicatedParams(Device& device, const std::vector<ParamSpec>& params,
                                   const FlatLayout& layout, Communicator& comm, std::uint64_t seed,
                                   DType precision, std::uint64_t allgather_bucket)
    : layout_(layout),
      comm_(comm),
      replica_(device, params, layout, seed, precision, std::nullopt),
      allgather_bucket_(allgather_bucket) {}

TypedPtr ReplicatedParams::owned() {
  return replica_.weights().at(layout_.owned_begin(comm_.rank()));
}

void ReplicatedParams::publish() {
  const auto t0 = std::chrono::steady_clock::now();
  replica_.publish(comm_, allgather_bucket_);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

MemoryEstimate ReplicatedParams::estimate(const FlatLayout& layout, DType precision) {
  return MemoryEstimate().set(Tier::device, Category::params,
                              layout.total() * dtype_size(precision));
}

ShardedParams::ShardedParams(Device& device, const std::vector<ParamSpec>& params,
                             const std::vector<ModuleSpec>& modules, const FlatLayout& layout,
                             Communicator& comm, std::uint64_t seed, DType precision, Tier tier,
                             const GatherOptions& gather, const std::string& strategy)
    : precision_(precision), tier_(tier) {
  const std::uint64_t begin = layout.owned_begin(comm.rank()), end = layout.owned_end(comm.rank());
  shard_ = device.allocate(tier, Category::params, (end - begin) * dtype_size(precision));
  init_flat(params, layout, seed, begin, end, owned());
  gatherer_.emplace(device, params, modules, layout, comm, owned(), gather, strategy);
}

MemoryEstimate ShardedParams::estimate(const std::vector<ParamSpec>& params,
                                       const FlatLayout& layout, DType precision, Tier tier,
                                       const GatherOptions& gather) {
  const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(layout.world());
  const GatherPeaks peaks = estimate_gather_peaks(params, gather);
  const std::size_t p = dtype_size(precision);
  MemoryEstimate e;
  e.bytes[static_cast<std::size_t>(tier)][static_cast<std::size_t>(Category::params)] += shard * p;
  e.bytes[static_cast<std::size_t>(Tier::device)][static_cast<std::size_t>(Category::params)] +=
      (peaks.persistent + peaks.live) * p;
  e.set(Tier::device, Category::comm, peaks.packed * p);
  return e;
}

}  // namespace ztrain::shard
