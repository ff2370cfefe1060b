// The reduction planner. Backward visits modules from the last to the
// first; a parameter's gradient is complete after the backward of its
// lowest-numbered user, so a bucket is complete after the lowest
// "completing" module among its parameters. Buckets are launched in bucket
// order only (every rank must issue the same sequence), so bucket i goes
// out after the module at which it and every bucket before it are
// complete. The policies then differ only in which micro-steps reduce,
// whether launches wait for the end of backward, and how many reductions
// may be in the air: the schedules below spell that out as launch and wait
// actions, and the peaks are read off the same actions.
#include "ztrain/shard/reduce_plan.h"

#include <algorithm>
#include <deque>

namespace ztrain::shard {
namespace {

// Per bucket, the module after whose backward it may be launched (a bucket
// of padding only is complete at once, after the last module).
IdVector<BucketId, ModuleId> launch_modules(const ParamSpecs& params,
                                            const IdVector<ParamId, BucketId>& bucket_of,
                                            std::size_t buckets) {
  const auto done = completed_by_module(params);
  const ModuleId last = id_at<ModuleId>(done.size() - 1);
  IdVector<BucketId, ModuleId> complete(buckets, last);
  IdVector<BucketId, bool> seen(buckets, false);
  for (ModuleId m : done.ids())
    for (ParamId p : done[m]) {
      const BucketId b = bucket_of[p];
      complete[b] = seen[b] ? std::min(complete[b], m) : m;
      seen[b] = true;
    }
  // A bucket goes out only after every bucket before it.
  for (BucketId b : complete.ids())
    if (b != BucketId{})
      complete[b] = std::min(complete[b], complete[id_at<BucketId>(index_of(b) - 1)]);
  return complete;
}

// The module whose backward first writes into the bucket (the highest user
// of any of its parameters); 0 when none uses them.
ModuleId first_use(const ParamSpecs& params, const IdVector<ParamId, BucketId>& bucket_of,
                   BucketId b) {
  ModuleId first{};
  for (ParamId p : params.ids())
    if (bucket_of[p] == b)
      for (ModuleId m : params[p].used_by) first = std::max(first, m);
  return first;
}

using Actions = std::vector<ReduceAction>;
constexpr auto kLaunch = ReduceAction::Kind::launch;
constexpr auto kWait = ReduceAction::Kind::wait;

// Launch every bucket, at most `in_air` reductions outstanding, then wait.
Actions launch_all_bounded(std::size_t buckets, std::size_t in_air) {
  Actions a;
  std::deque<BucketId> flying;
  for (BucketId b : first_ids<BucketId>(buckets)) {
    while (flying.size() >= in_air) {
      a.push_back({kWait, flying.front()});
      flying.pop_front();
    }
    a.push_back({kLaunch, b});
    flying.push_back(b);
  }
  for (BucketId b : flying) a.push_back({kWait, b});
  return a;
}

ReduceSchedule during_backward(const IdVector<BucketId, ModuleId>& launch_at, std::size_t modules,
                               bool overlap, bool wait_each_module) {
  ReduceSchedule s;
  s.after_module.resize(modules);
  std::vector<BucketId> flying;
  for (std::size_t i = modules; i-- > 0;) {
    const auto m = id_at<ModuleId>(i);
    Actions& a = s.after_module[m];
    // What went out after the previous module has had this module's
    // backward to finish in: its buffers go before new ones are launched.
    if (wait_each_module)
      for (BucketId b : flying) a.push_back({kWait, b});
    if (wait_each_module) flying.clear();
    for (BucketId b : launch_at.ids()) {
      if (launch_at[b] != m) continue;
      a.push_back({kLaunch, b});
      if (overlap)
        flying.push_back(b);
      else
        a.push_back({kWait, b});
    }
  }
  for (BucketId b : flying) s.at_end.push_back({kWait, b});
  return s;
}

}  // namespace

ReducePlan make_reduce_plan(const ParamSpecs& params, const FlatLayout& layout, ReducePolicy policy,
                            const ReduceSettings& settings) {
  ReducePlan plan;
  const auto ranges = reverse_buckets(
      layout, params, settings.bucket_elements,
      std::min(settings.bucket_elements, settings.first_bucket_elements), plan.bucket_of);
  const bool replicate = policy == ReducePolicy::replicate;
  for (const auto& r : ranges) {
    ReduceBucket b;
    b.range = {r.begin, r.end};
    b.params = r.params;
    b.collective = replicate ? Collective::all_reduce : Collective::reduce_scatter;
    if (!replicate) b.counts = layout.owned_counts(r.begin, r.end);
    b.staged = policy == ReducePolicy::shard_during_backward;
    b.first_use = first_use(params, plan.bucket_of, plan.buckets.end_id());
    b.landing = replicate                                      ? Landing::in_place
                : policy == ReducePolicy::shard_after_backward ? Landing::shard_write
                                                               : Landing::shard_accumulate;
    plan.buckets.push_back(std::move(b));
  }
  const std::size_t modules = completed_by_module(params).size();
  const auto launch_at = launch_modules(params, plan.bucket_of, plan.buckets.size());
  plan.accumulating.after_module.resize(modules);
  switch (policy) {
    case ReducePolicy::replicate:
      // Accumulating micro-steps add into the full buffer; the last one
      // reduces, during its backward with overlap, else after it.
      if (settings.overlap) {
        plan.last = during_backward(launch_at, modules, true, false);
      } else {
        plan.last.after_module.resize(modules);
        plan.last.at_end = launch_all_bounded(plan.buckets.size(), plan.buckets.size());
      }
      break;
    case ReducePolicy::shard_after_backward:
      plan.last.after_module.resize(modules);
      plan.last.at_end = launch_all_bounded(plan.buckets.size(), settings.overlap ? 2 : 1);
      break;
    case ReducePolicy::shard_during_backward:
      plan.last = during_backward(launch_at, modules, settings.overlap, true);
      plan.accumulating = plan.last;
      break;
  }
  return plan;
}

ReducePeaks reduce_peaks(const ReducePlan& plan, int rank) {
  ReducePeaks peak;
  for (const ReduceSchedule* s : {&plan.accumulating, &plan.last}) {
    std::uint64_t staged = 0, recv = 0;
    IdVector<BucketId, bool> open(plan.buckets.size(), false);
    const auto run = [&](const std::vector<ReduceAction>& actions) {
      for (const auto& a : actions) {
        const ReduceBucket& b = plan.buckets[a.bucket];
        const std::uint64_t own = b.counts.empty() ? 0 : b.counts[static_cast<std::size_t>(rank)];
        const std::uint64_t size = b.range.end - b.range.begin;
        if (a.kind == ReduceAction::Kind::launch) {
          if (b.staged && !open[a.bucket]) staged += size;
          open[a.bucket] = b.staged;
          recv += own;
        } else {
          recv -= own;
          if (b.staged) staged -= size;
          open[a.bucket] = false;
        }
        peak.staged = std::max(peak.staged, staged);
        peak.recv = std::max(peak.recv, recv);
      }
    };
    for (std::size_t i = s->after_module.size(); i-- > 0;) {
      const auto m = id_at<ModuleId>(i);
      // The module's backward opens the staging buffers it writes first.
      for (BucketId b : plan.buckets.ids()) {
        const ReduceBucket& bucket = plan.buckets[b];
        if (bucket.staged && !open[b] && bucket.first_use == m) {
          open[b] = true;
          staged += bucket.range.end - bucket.range.begin;
        }
      }
      peak.staged = std::max(peak.staged, staged);
      run(s->after_module[m]);
    }
    run(s->at_end);
  }
  return peak;
}

ReducePeaks worst_reduce_peaks(const ReducePlan& plan, int world) {
  ReducePeaks worst;
  for (int r = 0; r < world; ++r) {
    const ReducePeaks p = reduce_peaks(plan, r);
    worst.staged = std::max(worst.staged, p.staged);
    worst.recv = std::max(worst.recv, p.recv);
  }
  return worst;
}

}  // namespace ztrain::shard
