#include "ztrain/shard/param_store.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "ztrain/shard/init.h"
#include "ztrain/shard/swapped_shard.h"

namespace ztrain::shard {
namespace {

// The most bytes of `loan` (per group) held at once when the gatherer runs
// `plan` over `trace` and, before it, each module's `needs` on demand: a
// gather borrows from when it is issued until its group is used or
// dropped, and at most `cap` borrow at once (issuing another first
// finishes the oldest), as ParamGatherer does.
std::uint64_t loans_peak(const GatherPlan& plan, const std::vector<std::vector<GroupId>>& trace,
                         const GroupNeeds& needs, const IdVector<GroupId, std::uint64_t>& loan,
                         std::size_t cap) {
  std::deque<GroupId> in_flight;  // oldest first
  std::uint64_t held = 0, peak = 0;
  const auto settle = [&](GroupId g) {
    const auto at = std::find(in_flight.begin(), in_flight.end(), g);
    if (at == in_flight.end()) return;
    in_flight.erase(at);
    held -= loan[g];
  };
  const auto issue = [&](GroupId g) {
    if (in_flight.size() >= cap) settle(in_flight.front());
    in_flight.push_back(g);
    held += loan[g];
    peak = std::max(peak, held);
  };
  for (const auto& need : needs) {
    for (GroupId g : need) issue(g);
    for (GroupId g : need) settle(g);
  }
  for (std::size_t i = 0; i < trace.size(); ++i) {
    for (GroupId g : plan.evict[i]) settle(g);
    for (GroupId g : plan.gather[i]) issue(g);
    for (GroupId g : trace[i]) settle(g);
    for (GroupId g : plan.release[i]) settle(g);
  }
  return peak;
}

// The host buffers a swapped shard's reads take at once, for the worst
// rank: the gathers' loans (the pages holding each group's part) over the
// standard trace, under gather.read_buffers; initialisation and the
// optimizer's start read slices of at most SwappedShard::kSlice elements;
// import borrows one parameter's pages twice (converted, and read around).
std::uint64_t swap_staging_peak(const ParamSpecs& params, const FlatLayout& layout, DType precision,
                                const GatherOptions& gather) {
  const StandardGathers g = standard_gathers(params, layout, gather);
  check_read_buffer_size(g.groups, layout, params, gather.read_buffer_size);
  const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(layout.world());
  std::uint64_t peak =
      SwappedShard::loan_bytes(0, 0, std::min(shard, SwappedShard::kSlice), precision);
  for (int r = 0; r < layout.world(); ++r) {
    const std::uint64_t ob = layout.owned_begin(r), oe = layout.owned_end(r);
    const auto loan = [&](std::uint64_t b, std::uint64_t e) {
      b = std::max(b, ob), e = std::min(e, oe);
      return b < e ? SwappedShard::loan_bytes(ob, b, e, precision) : 0;
    };
    IdVector<GroupId, std::uint64_t> loans;
    for (const auto& group : g.groups) loans.push_back(loan(group.begin, group.end));
    for (ParamId id : params.ids())
      peak = std::max(peak, 2 * loan(layout.offset(id), layout.offset(id) + layout.numel(id)));
    peak = std::max(peak, loans_peak(g.plan, g.trace, g.needs, loans,
                                     gather.read_buffers ? gather.read_buffers : SIZE_MAX));
  }
  return peak;
}

}  // namespace

ParamStore::~ParamStore() = default;

ReplicatedParams::ReplicatedParams(Device& device, const ParamSpecs& params,
                                   const FlatLayout& layout, Communicator& comm,
                                   std::optional<std::uint64_t> seed, DType precision,
                                   std::uint64_t allgather_bucket)
    : layout_(layout),
      comm_(comm),
      replica_(device, params, layout, seed, precision, std::nullopt),
      owned_(device, layout.owned_begin(comm.rank()), layout.owned_end(comm.rank()),
             replica_.weights().at(layout.owned_begin(comm.rank())), Tier::device),
      allgather_bucket_(allgather_bucket) {}

void ReplicatedParams::publish() {
  const auto t0 = std::chrono::steady_clock::now();
  replica_.publish(comm_, allgather_bucket_);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

MemoryEstimate ReplicatedParams::estimate(const FlatLayout& layout, DType precision) {
  return MemoryEstimate().set(Tier::device, Category::params,
                              layout.total() * dtype_size(precision));
}

ShardedParams::ShardedParams(Device& device, const ParamSpecs& params, const ModuleSpecs& modules,
                             const FlatLayout& layout, Communicator& comm,
                             std::optional<std::uint64_t> seed, DType precision,
                             const ParamPlacement& placement, const GatherOptions& gather,
                             const std::string& strategy) {
  const std::uint64_t begin = layout.owned_begin(comm.rank()), end = layout.owned_end(comm.rank());
  if (placement.tier == Tier::nvme) {
    owned_ = std::make_unique<SwappedShard>(device, begin, end, precision, placement.dir,
                                            placement.aio, comm.rank());
    // Initial values slice by slice through one host buffer.
    for (std::uint64_t b = begin; seed && b < end; b += SwappedShard::kSlice) {
      const std::uint64_t e = std::min(end, b + SwappedShard::kSlice);
      Buffer slice = device.allocate(Tier::host, Category::offload,
                                     SwappedShard::loan_bytes(b, b, e, precision), Fill::undefined);
      init_flat(params, layout, *seed, b, e, TypedPtr{slice.data(), precision}, device, Tier::host);
      AioEngine::Ticket t = owned_->write_async(b, {slice.data(), precision}, e - b);
      owned_->wait(t);
    }
  } else {
    memory_ =
        device.allocate(placement.tier, Category::params, (end - begin) * dtype_size(precision));
    owned_ = std::make_unique<ResidentShard>(device, begin, end,
                                             TypedPtr{memory_.data(), precision}, placement.tier);
    if (seed)
      init_flat(params, layout, *seed, begin, end, owned_->resident(), device, placement.tier);
  }
  gatherer_.emplace(device, params, modules, layout, comm, *owned_, gather, strategy);
}

MemoryEstimate ShardedParams::estimate(const ParamSpecs& params, const FlatLayout& layout,
                                       DType precision, Tier tier, const GatherOptions& gather) {
  const std::uint64_t shard = layout.total() / static_cast<std::uint64_t>(layout.world());
  const GatherPeaks peaks = estimate_gather_peaks(params, gather);
  const std::size_t p = dtype_size(precision);
  MemoryEstimate e;
  if (tier == Tier::nvme) {
    e.set(Tier::nvme, Category::params, SwappedShard::file_bytes(shard, precision));
    e.set(Tier::host, Category::offload, swap_staging_peak(params, layout, precision, gather));
  } else {
    e.bytes[tier][Category::params] += shard * p;
  }
  e.bytes[Tier::device][Category::params] += (peaks.persistent + peaks.live) * p;
  e.set(Tier::device, Category::comm, peaks.packed * p);
  return e;
}

}  // namespace ztrain::shard
