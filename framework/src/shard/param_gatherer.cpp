#include "ztrain/shard/param_gatherer.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain::shard {

namespace {

// The gather plan is made by walking the trace once, position by
// position, keeping the set of live units (gathered and not yet released)
// and their total. At each position i the planner runs five phases:
//
// 1. evict: while the units position i needs but lacks would push the
//    total past max_live_parameters, release the live unit whose next use
//    is farthest away (Belady's choice; a unit never used again is the
//    farthest). A unit position i needs is never a victim; the needs alone
//    fit by contract.
// 2. gather the needs: every needed unit not live is gathered now.
// 3. prefetch: walk the positions after i, gathering the units they need
//    in trace order while they fit in what is left of
//    prefetch_bucket_size (a budget for each position i) and under
//    max_live_parameters; the first unit that does not fit ends the
//    prefetch (later units would be fetched out of order). Units already
//    live on the way are claimed for the position that uses them.
// 4. mark reuse: the units needed within the next max_reuse_distance
//    elements of the trace are kept past position i instead of released.
// 5. release: each unit position i needed is released after it, unless a
//    prefetch or fetch counted on it for a later position ("claimed") or it
//    is kept for reuse.
// After the last position every unit still live is released.
//
// "claimed" matters for correctness, not only speed: a unit prefetched for
// position j and needed at i < j too must not be released after i, or the
// prefetch would be lost and j would gather it again.
class GatherPlanner {
 public:
  GatherPlanner(const std::vector<std::vector<GroupId>>& needs,
                const IdVector<GroupId, std::uint64_t>& numel, const GatherOptions& o)
      : needs_(needs),
        numel_(numel),
        o_(o),
        uses_(numel.size()),
        live_(numel.size(), false),
        claimed_(numel.size()),
        keep_(numel.size()) {
    for (std::size_t i = 0; i < positions(); ++i)
      for (GroupId g : need(i)) uses_[g].push_back(i);
    plan_.evict.resize(needs.size());
    plan_.gather.resize(needs.size());
    plan_.release.resize(needs.size());
  }

  GatherPlan make() {
    if (positions() == 0) return plan_;
    for (std::size_t i = 0; i < positions(); ++i) {
      evict_for(i);
      gather_needs(i);
      prefetch_after(i);
      plan_.peak_live = std::max(plan_.peak_live, total_);
      mark_reuse_after(i);
      release_after(i);
    }
    for (GroupId g : live_.ids())
      if (live_[g]) plan_.release.back().push_back(g);
    return plan_;
  }

 private:
  static constexpr std::size_t kNever = SIZE_MAX;
  std::size_t positions() const { return needs_.size(); }
  const std::vector<GroupId>& need(std::size_t i) const { return needs_[i]; }
  bool needed_at(GroupId g, std::size_t i) const {
    return std::find(need(i).begin(), need(i).end(), g) != need(i).end();
  }
  // The first position after i that uses g (kNever: none).
  std::size_t next_use(GroupId g, std::size_t i) const {
    const auto& u = uses_[g];
    const auto it = std::upper_bound(u.begin(), u.end(), i);
    return it == u.end() ? kNever : *it;
  }
  void make_live(GroupId g, std::size_t at) {
    live_[g] = true;
    total_ += numel_[g];
    plan_.gather[at].push_back(g);
  }
  void claim(GroupId g, std::size_t j) {
    claimed_[g] = claimed_[g] ? std::max(*claimed_[g], j) : j;
  }

  // Phase 1 (above).
  void evict_for(std::size_t i) {
    std::uint64_t missing = 0;
    for (GroupId g : need(i))
      if (!live_[g]) missing += numel_[g];
    while (total_ + missing > o_.max_live_parameters) {
      std::optional<GroupId> victim;
      std::size_t farthest = 0;
      for (GroupId g : live_.ids()) {
        if (!live_[g] || needed_at(g, i)) continue;
        const std::size_t next = next_use(g, i);
        if (!victim || next > farthest) farthest = next, victim = g;
      }
      if (!victim) return;  // only the needs are live: they fit by contract
      live_[*victim] = false;
      claimed_[*victim].reset();
      total_ -= numel_[*victim];
      plan_.evict[i].push_back(*victim);
    }
  }

  // Phase 2.
  void gather_needs(std::size_t i) {
    for (GroupId g : need(i)) {
      if (!live_[g]) make_live(g, i);
      claim(g, i);
    }
  }

  // Phase 3: a unit already live is claimed for the position that will use
  // it, so phase 5 keeps it.
  void prefetch_after(std::size_t i) {
    if (o_.prefetch_bucket_size == 0) return;
    std::uint64_t budget = o_.prefetch_bucket_size;
    for (std::size_t j = i + 1; j < positions(); ++j)
      for (GroupId g : need(j)) {
        if (live_[g]) {
          claim(g, j);
          continue;
        }
        if (numel_[g] > budget || total_ + numel_[g] > o_.max_live_parameters) return;
        make_live(g, i);
        budget -= numel_[g];
        claimed_[g] = j;
      }
  }

  // Phase 4.
  void mark_reuse_after(std::size_t i) {
    std::uint64_t traversed = 0;
    for (std::size_t j = i + 1; j < positions() && traversed < o_.max_reuse_distance; ++j)
      for (GroupId g : need(j)) {
        keep_[g] = i;
        traversed += numel_[g];
      }
  }

  // Phase 5.
  void release_after(std::size_t i) {
    for (GroupId g : need(i)) {
      if (!live_[g] || (claimed_[g] && *claimed_[g] > i) || keep_[g] == i) continue;
      live_[g] = false;
      total_ -= numel_[g];
      plan_.release[i].push_back(g);
    }
  }

  const std::vector<std::vector<GroupId>>& needs_;
  const IdVector<GroupId, std::uint64_t>& numel_;
  const GatherOptions& o_;
  IdVector<GroupId, std::vector<std::size_t>> uses_;  // the positions using it, ascending
  IdVector<GroupId, bool> live_;
  // The last position a fetch or a prefetch counted on the unit being
  // gathered: releasing it earlier would undo that prefetch.
  IdVector<GroupId, std::optional<std::size_t>> claimed_;
  // The position after which the unit is kept for reuse.
  IdVector<GroupId, std::optional<std::size_t>> keep_;
  std::uint64_t total_ = 0;  // elements live
  GatherPlan plan_;
};

}  // namespace

GatherPlan make_gather_plan(const std::vector<std::vector<GroupId>>& needs,
                            const IdVector<GroupId, std::uint64_t>& numel, const GatherOptions& o) {
  return GatherPlanner(needs, numel, o).make();
}

std::vector<TraceEntry> standard_trace(std::size_t modules) {
  std::vector<TraceEntry> t;
  for (ModuleId m : first_ids<ModuleId>(modules)) t.push_back({m, false});
  for (std::size_t m = modules; m-- > 0;) t.push_back({id_at<ModuleId>(m), true});
  return t;
}

GatherGroups gather_groups(const ParamSpecs& params, const FlatLayout& layout,
                           std::uint64_t persistence_threshold) {
  GatherGroups groups;
  std::optional<GroupId> open;  // the group the next parameter may join
  for (ParamId id : params.ids()) {
    auto users = params[id].used_by;
    std::sort(users.begin(), users.end());
    users.erase(std::unique(users.begin(), users.end()), users.end());
    // A parameter of other modules ends the run; a persistent one of the
    // same modules does not (it rides along, a few elements).
    if (open && groups[*open].used_by != users) open.reset();
    const std::uint64_t begin = layout.offset(id), end = begin + layout.numel(id);
    if (layout.numel(id) <= persistence_threshold) continue;
    if (!open) {
      open = groups.push_back({begin, end, {id}, users});
    } else {
      groups[*open].end = end;
      groups[*open].params.push_back(id);
    }
  }
  return groups;
}

GroupNeeds group_needs(const GatherGroups& groups, std::size_t modules) {
  GroupNeeds needs(modules);
  for (GroupId g : groups.ids())
    for (ModuleId m : groups[g].used_by)
      if (needs.contains(m)) needs[m].push_back(g);
  return needs;
}

namespace {

// Every module must fit under the live cap by itself.
void check_live_cap(const GroupNeeds& needs, const IdVector<GroupId, std::uint64_t>& size,
                    std::uint64_t cap, const IdVector<ModuleId, std::string>& names) {
  for (ModuleId m : needs.ids()) {
    std::uint64_t n = 0;
    for (GroupId g : needs[m]) n += size[g];
    if (n > cap)
      throw ConfigError("[strategy] max_live_parameters = " + std::to_string(cap) +
                        " is smaller than module " +
                        (names.contains(m) ? "'" + names[m] + "'" : to_string(m)) +
                        ", which needs " + std::to_string(n) +
                        " gathered elements at once; raise it to at least " + std::to_string(n));
  }
}

IdVector<GroupId, std::uint64_t> group_sizes(const GatherGroups& groups) {
  IdVector<GroupId, std::uint64_t> sizes;
  for (const auto& g : groups) sizes.push_back(g.size());
  return sizes;
}

// Modules the parameters name: one past the highest user (at least one).
std::size_t module_count(const ParamSpecs& params) {
  std::size_t modules = 1;
  for (const auto& p : params)
    for (ModuleId m : p.used_by) modules = std::max(modules, index_of(m) + 1);
  return modules;
}

}  // namespace

StandardGathers standard_gathers(const ParamSpecs& params, const FlatLayout& layout,
                                 const GatherOptions& options) {
  const std::size_t modules = module_count(params);
  StandardGathers s;
  s.groups = gather_groups(params, layout, options.param_persistence_threshold);
  s.needs = group_needs(s.groups, modules);
  const auto sizes = group_sizes(s.groups);
  check_live_cap(s.needs, sizes, options.max_live_parameters, {});
  for (const auto& e : standard_trace(modules)) s.trace.push_back(s.needs[e.module]);
  s.plan = make_gather_plan(s.trace, sizes, options);
  return s;
}

GatherPeaks estimate_gather_peaks(const ParamSpecs& params, const GatherOptions& options) {
  GatherPeaks peaks;
  for (const auto& p : params) {
    const auto n = static_cast<std::uint64_t>(p.shape.numel());
    if (n <= options.param_persistence_threshold) peaks.persistent += n;
  }
  peaks.live = standard_gathers(params, FlatLayout(params, 1), options).plan.peak_live;
  peaks.packed = peaks.persistent;
  return peaks;
}

void declare_gather_options(OptionList& o) {
  o.integer("prefetch_bucket_size", 50000000,
            "elements of upcoming modules' parameters gathered ahead of use")
      .at_least(0);
  o.integer("max_live_parameters", 1000000000,
            "most elements of parameters gathered at once (persistent ones aside)")
      .at_least(1);
  o.integer("param_persistence_threshold", 100000,
            "parameters of at most this many elements stay gathered")
      .at_least(0);
  o.integer("max_reuse_distance", 1000000000,
            "keep a parameter gathered when it is used again within this many elements of "
            "other fetches")
      .at_least(0);
}

GatherOptions gather_options(const Options& o) {
  auto get = [&](const char* key) { return static_cast<std::uint64_t>(o.get_int(key)); };
  return {get("prefetch_bucket_size"), get("max_live_parameters"),
          get("param_persistence_threshold"), get("max_reuse_distance")};
}

ParamGatherer::ParamGatherer(Device& device, const ParamSpecs& params, const ModuleSpecs& modules,
                             const FlatLayout& layout, Communicator& comm, OwnedShard& shard,
                             const GatherOptions& options, std::string strategy)
    : device_(device),
      comm_(comm),
      layout_(layout),
      shard_(shard),
      dtype_(shard.dtype()),
      options_(options),
      strategy_(std::move(strategy)),
      groups_(gather_groups(params, layout, options.param_persistence_threshold)) {
  for (ParamId id : params.ids())
    params_.push_back({layout.offset(id), layout.numel(id), std::nullopt, params[id].shape});
  for (GroupId g : groups_.ids()) {
    for (ParamId p : groups_[g].params) params_[p].group = g;
    live_groups_.emplace_back().counts = layout.owned_counts(groups_[g].begin, groups_[g].end);
  }
  for (const auto& m : modules) module_names_.push_back(m.name);
  needs_ = group_needs(groups_, modules.size());
  check_live_cap(needs_, group_sizes(groups_), options.max_live_parameters, module_names_);
  if (!shard.resident()) check_read_buffer_size(groups_, layout, params, options.read_buffer_size);
  build_persistent();
  refresh();
}

ParamGatherer::~ParamGatherer() {
  for (auto& g : live_groups_) {
    if (g.state != State::in_flight) continue;
    try {
      g.work.wait();
    } catch (...) {  // an error on the way out: the buffer must outlive the collective anyway
    }
  }
}

void check_read_buffer_size(const GatherGroups& groups, const FlatLayout& layout,
                            const ParamSpecs& params, std::uint64_t buffer_size) {
  if (buffer_size == 0) return;
  for (const GatherGroup& g : groups) {
    const auto counts = layout.owned_counts(g.begin, g.end);
    const std::uint64_t part = *std::max_element(counts.begin(), counts.end());
    if (part <= buffer_size) continue;
    throw ConfigError("[strategy] offload_param.buffer_size = " + std::to_string(buffer_size) +
                      " elements is smaller than a rank's part of the parameters gathered with '" +
                      params[g.params.front()].name + "' (" + std::to_string(part) +
                      " elements); raise it to at least " + std::to_string(part));
  }
}

void ParamGatherer::build_persistent() {
  persistent_at_ = IdVector<ParamId, std::uint64_t>(params_.size(), 0);
  for (ParamId p : params_.ids()) {
    if (params_[p].group) continue;
    persistent_at_[p] = persistent_elements_;
    persistent_elements_ += params_[p].numel;
  }
  persistent_ = device_.allocate(Tier::device, Category::params, bytes(persistent_elements_));
  for (int r = 0; r < layout_.world(); ++r) {
    std::size_t packed = 0;
    for (ParamId p : params_.ids()) {
      if (params_[p].group) continue;
      const std::uint64_t b = std::max(params_[p].offset, layout_.owned_begin(r));
      const std::uint64_t e = std::min(params_[p].offset + params_[p].numel, layout_.owned_end(r));
      if (b >= e) continue;
      pieces_.push_back({p, b, e});
      packed += e - b;
    }
    piece_counts_.push_back(packed);
  }
}

ShardLoan ParamGatherer::own_part(std::uint64_t begin, std::uint64_t end) {
  const std::uint64_t b = std::max(begin, shard_.begin()), e = std::min(end, shard_.end());
  return b < e ? shard_.lend(b, e) : ShardLoan{Buffer(), {nullptr, dtype_}};
}

void ParamGatherer::log(GatherEvent::Kind kind, GroupId g) {
  if (log_) log_->push_back({kind, g, training_ ? std::optional(position_) : std::nullopt, live_});
}

void ParamGatherer::gather(GroupId id) {
  Live& g = live_groups_[id];
  const GatherGroup& range = groups_[id];
  if (g.state != State::released)
    throw InternalError(strategy_ + ": gather plan: group " + to_string(id) +
                        " is already gathered");
  g.buffer = device_.allocate(Tier::device, Category::params, bytes(range.size()));
  if (!shard_.resident()) {
    // A read buffer: the oldest gather holding one finishes first when all
    // are taken.
    if (options_.read_buffers && reading_.size() >= options_.read_buffers) wait(reading_.front());
    reading_.push_back(id);
  }
  g.send = own_part(range.begin, range.end);
  // A rank owning none of the group sends nothing from any valid pointer.
  const void* send = g.send.data ? g.send.data.data : g.buffer.data();
  g.work = comm_.all_gather_v_async(send, g.buffer.data(), g.counts, dtype_);
  g.state = State::in_flight;
  live_ += range.size();
  log(GatherEvent::Kind::gather, id);
}

void ParamGatherer::wait(GroupId id) {
  Live& g = live_groups_[id];
  if (g.state != State::in_flight) return;
  const auto t0 = std::chrono::steady_clock::now();
  g.work.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g.work = {};
  g.send = {};
  if (auto r = std::find(reading_.begin(), reading_.end(), id); r != reading_.end())
    reading_.erase(r);
  g.state = State::live;
}

void ParamGatherer::drop(GroupId id) {
  Live& g = live_groups_[id];
  if (g.state == State::released) return;
  wait(id);  // a buffer under a collective cannot go
  g.buffer.reset();
  g.state = State::released;
  live_ -= groups_[id].size();
  log(GatherEvent::Kind::release, id);
}

void ParamGatherer::release_all() {
  for (GroupId g : live_groups_.ids()) drop(g);
}

std::string ParamGatherer::describe(const TraceEntry& e) const {
  return (module_names_.contains(e.module) ? "'" + module_names_[e.module] + "'"
                                           : "module " + to_string(e.module)) +
         (e.backward ? " backward" : " forward");
}

void ParamGatherer::end_micro_step() {
  if (!training_) return;
  if (!recorded_) {
    std::vector<std::vector<GroupId>> needs;
    for (const auto& e : trace_) needs.push_back(needs_[e.module]);
    plan_ = make_gather_plan(needs, group_sizes(groups_), options_);
    recorded_ = true;
  } else if (position_ != trace_.size()) {
    throw Error(strategy_ + ": this micro-step ran " + std::to_string(position_) +
                " module passes, the first one " + std::to_string(trace_.size()) +
                " (next expected: " + describe(trace_[position_]) +
                "); parameter prefetch follows the first step's module order, so the model must "
                "run the same modules every step");
  }
  release_all();
  training_ = false;
}

void ParamGatherer::begin_micro_step() {
  end_micro_step();
  training_ = true;
  position_ = 0;
}

void ParamGatherer::end_step() {
  end_micro_step();
}

void ParamGatherer::fetch(ModuleId m, bool backward) {
  if (!needs_.contains(m))
    throw InternalError(strategy_ + ": fetch of module " + to_string(m) +
                        ", which the model did not declare");
  const auto& need = needs_[m];
  const TraceEntry here{m, backward};
  if (training_ && recorded_) {
    const std::size_t i = position_;
    if (i >= trace_.size() || !(trace_[i] == here))
      throw Error(strategy_ + ": the module order changed at position " + std::to_string(i) +
                  " of the micro-step: the first step ran " +
                  (i < trace_.size() ? describe(trace_[i]) : std::string("nothing more")) +
                  " there, this one " + describe(here) +
                  "; parameter prefetch follows the first step's module order, so the model must "
                  "run the same modules in the same order every step");
    for (GroupId g : plan_.evict[i]) drop(g);
    for (GroupId g : plan_.gather[i]) gather(g);
  } else {
    if (training_) trace_.push_back(here);
    for (GroupId g : need)
      if (live_groups_[g].state == State::released) gather(g);
  }
  for (GroupId g : need) {
    if (live_groups_[g].state == State::released)
      throw InternalError(strategy_ + ": gather plan: group " + to_string(g) + " needed by " +
                          describe(here) + " was not gathered");
    wait(g);
    log(GatherEvent::Kind::use, g);
  }
}

void ParamGatherer::release(ModuleId m, bool backward) {
  const std::size_t i = position_;
  if (training_ && recorded_) {
    if (i >= trace_.size() || !(trace_[i] == TraceEntry{m, backward}))
      throw InternalError(strategy_ + ": release of " + describe({m, backward}) +
                          " without its fetch");
    for (GroupId g : plan_.release[i]) drop(g);
    ++position_;
    return;
  }
  if (training_) ++position_;
  for (GroupId g : needs_.at(m)) drop(g);
}

TensorView ParamGatherer::view(ParamId id) const {
  const Param& p = params_.at(id);
  if (!p.group) {
    const TypedPtr whole{persistent_.data(), dtype_};
    return {whole.at(persistent_at_[id]).data, dtype_, p.shape};
  }
  const Live& g = live_groups_[*p.group];
  if (g.state != State::live)
    throw InternalError(strategy_ + ": parameter " + to_string(id) +
                        " viewed while not gathered: it is used by a module missing from its "
                        "used_by list");
  const TypedPtr whole{g.buffer.data(), dtype_};
  return {whole.at(p.offset - groups_[*p.group].begin).data, dtype_, p.shape};
}

void ParamGatherer::refresh() {
  if (persistent_elements_ == 0) return;
  // Every rank's owned pieces, packed rank after rank: one all-gather.
  Buffer packed = device_.allocate(Tier::device, Category::comm, bytes(persistent_elements_));
  const TypedPtr all{packed.data(), dtype_};
  const int rank = comm_.rank();
  std::uint64_t at = 0;
  for (int r = 0; r < rank; ++r) at += piece_counts_[static_cast<std::size_t>(r)];
  const std::uint64_t mine = at;
  for (const Piece& piece : pieces_) {
    if (piece.begin < layout_.owned_begin(rank) || piece.end > layout_.owned_end(rank)) continue;
    const ShardLoan part = shard_.lend(piece.begin, piece.end);
    device_.copy(all.at(at).data, part.data.data, bytes(piece.end - piece.begin));
    at += piece.end - piece.begin;
  }
  const auto t0 = std::chrono::steady_clock::now();
  comm_.all_gather_v_async(all.at(mine).data, packed.data(), piece_counts_, dtype_).wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const TypedPtr whole{persistent_.data(), dtype_};
  at = 0;
  for (const Piece& piece : pieces_) {
    const Param& p = params_[piece.param];
    device_.copy(whole.at(persistent_at_[piece.param] + piece.begin - p.offset).data,
                 all.at(at).data, bytes(piece.end - piece.begin));
    at += piece.end - piece.begin;
  }
}

void ParamGatherer::read(ParamId id, float* out) {
  const Param& p = params_.at(id);
  const auto counts = layout_.owned_counts(p.offset, p.offset + p.numel);
  const ShardLoan part = own_part(p.offset, p.offset + p.numel);
  if (dtype_ == DType::f32) {
    comm_.all_gather_v_async(part.data ? part.data.data : out, out, counts, DType::f32).wait();
    return;
  }
  std::vector<std::uint16_t> whole(p.numel);
  comm_.all_gather_v_async(part.data ? part.data.data : whole.data(), whole.data(), counts, dtype_)
      .wait();
  convert(whole.data(), dtype_, out, DType::f32, p.numel);
}

}  // namespace ztrain::shard
