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
  GatherPlanner(const std::vector<std::vector<int>>& needs, const std::vector<std::uint64_t>& numel,
                const GatherOptions& o)
      : needs_(needs),
        numel_(numel),
        o_(o),
        uses_(numel.size()),
        live_(numel.size(), 0),
        claimed_(numel.size(), -1),
        keep_(numel.size(), -1) {
    for (int i = 0; i < positions(); ++i)
      for (int p : need(i)) uses_[unit(p)].push_back(i);
    plan_.evict.resize(needs.size());
    plan_.gather.resize(needs.size());
    plan_.release.resize(needs.size());
  }

  GatherPlan make() {
    if (positions() == 0) return plan_;
    for (int i = 0; i < positions(); ++i) {
      evict_for(i);
      gather_needs(i);
      prefetch_after(i);
      plan_.peak_live = std::max(plan_.peak_live, total_);
      mark_reuse_after(i);
      release_after(i);
    }
    for (std::size_t q = 0; q < live_.size(); ++q)
      if (live_[q]) plan_.release.back().push_back(static_cast<int>(q));
    return plan_;
  }

 private:
  int positions() const { return static_cast<int>(needs_.size()); }
  const std::vector<int>& need(int i) const { return needs_[static_cast<std::size_t>(i)]; }
  static std::size_t unit(int p) { return static_cast<std::size_t>(p); }
  std::uint64_t size(int p) const { return numel_[unit(p)]; }
  bool needed_at(int p, int i) const {
    return std::find(need(i).begin(), need(i).end(), p) != need(i).end();
  }
  // The first position after i that uses p (INT_MAX: none).
  int next_use(int p, int i) const {
    const auto& u = uses_[unit(p)];
    const auto it = std::upper_bound(u.begin(), u.end(), i);
    return it == u.end() ? INT_MAX : *it;
  }
  void make_live(int p, int at) {
    live_[unit(p)] = 1;
    total_ += size(p);
    plan_.gather[static_cast<std::size_t>(at)].push_back(p);
  }

  // Phase 1 (above).
  void evict_for(int i) {
    std::uint64_t missing = 0;
    for (int p : need(i))
      if (!live_[unit(p)]) missing += size(p);
    while (total_ + missing > o_.max_live_parameters) {
      int victim = -1, farthest = -1;
      for (std::size_t q = 0; q < live_.size(); ++q) {
        const auto p = static_cast<int>(q);
        if (!live_[q] || needed_at(p, i)) continue;
        const int next = next_use(p, i);
        if (next > farthest) farthest = next, victim = p;
      }
      if (victim < 0) return;  // only the needs are live: they fit by contract
      live_[unit(victim)] = 0;
      claimed_[unit(victim)] = -1;
      total_ -= size(victim);
      plan_.evict[static_cast<std::size_t>(i)].push_back(victim);
    }
  }

  // Phase 2.
  void gather_needs(int i) {
    for (int p : need(i)) {
      if (!live_[unit(p)]) make_live(p, i);
      claimed_[unit(p)] = std::max(claimed_[unit(p)], i);
    }
  }

  // Phase 3: a unit already live is claimed for the position that will use
  // it, so phase 5 keeps it.
  void prefetch_after(int i) {
    if (o_.prefetch_bucket_size == 0) return;
    std::uint64_t budget = o_.prefetch_bucket_size;
    for (int j = i + 1; j < positions(); ++j)
      for (int p : need(j)) {
        if (live_[unit(p)]) {
          claimed_[unit(p)] = std::max(claimed_[unit(p)], j);
          continue;
        }
        if (size(p) > budget || total_ + size(p) > o_.max_live_parameters) return;
        make_live(p, i);
        budget -= size(p);
        claimed_[unit(p)] = j;
      }
  }

  // Phase 4.
  void mark_reuse_after(int i) {
    std::uint64_t traversed = 0;
    for (int j = i + 1; j < positions() && traversed < o_.max_reuse_distance; ++j)
      for (int p : need(j)) {
        keep_[unit(p)] = i;
        traversed += size(p);
      }
  }

  // Phase 5.
  void release_after(int i) {
    for (int p : need(i)) {
      const std::size_t q = unit(p);
      if (!live_[q] || claimed_[q] > i || keep_[q] == i) continue;
      live_[q] = 0;
      total_ -= size(p);
      plan_.release[static_cast<std::size_t>(i)].push_back(p);
    }
  }

  const std::vector<std::vector<int>>& needs_;
  const std::vector<std::uint64_t>& numel_;
  const GatherOptions& o_;
  std::vector<std::vector<int>> uses_;  // per unit, the positions using it, ascending
  std::vector<char> live_;
  // The last position a fetch or a prefetch counted on the unit being
  // gathered: releasing it earlier would undo that prefetch.
  std::vector<int> claimed_;
  std::vector<int> keep_;    // the position after which the unit is kept for reuse
  std::uint64_t total_ = 0;  // elements live
  GatherPlan plan_;
};

}  // namespace

GatherPlan make_gather_plan(const std::vector<std::vector<int>>& needs,
                            const std::vector<std::uint64_t>& numel, const GatherOptions& o) {
  return GatherPlanner(needs, numel, o).make();
}

std::vector<TraceEntry> standard_trace(int modules) {
  std::vector<TraceEntry> t;
  for (int m = 0; m < modules; ++m) t.push_back({m, false});
  for (int m = modules; m-- > 0;) t.push_back({m, true});
  return t;
}

std::vector<GatherGroup> gather_groups(const std::vector<ParamSpec>& params,
                                       const FlatLayout& layout,
                                       std::uint64_t persistence_threshold) {
  std::vector<GatherGroup> groups;
  int open = -1;  // the group the next parameter may join
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto users = params[i].used_by;
    std::sort(users.begin(), users.end());
    users.erase(std::unique(users.begin(), users.end()), users.end());
    // A parameter of other modules ends the run; a persistent one of the
    // same modules does not (it rides along, a few elements).
    if (open >= 0 && groups[static_cast<std::size_t>(open)].used_by != users) open = -1;
    const auto id = static_cast<ParamId>(i);
    const std::uint64_t begin = layout.offset(id), end = begin + layout.numel(id);
    if (layout.numel(id) <= persistence_threshold) continue;
    if (open < 0) {
      groups.push_back({begin, end, {id}, users});
      open = static_cast<int>(groups.size()) - 1;
    } else {
      groups[static_cast<std::size_t>(open)].end = end;
      groups[static_cast<std::size_t>(open)].params.push_back(id);
    }
  }
  return groups;
}

std::vector<std::vector<int>> group_needs(const std::vector<GatherGroup>& groups, int modules) {
  std::vector<std::vector<int>> needs(static_cast<std::size_t>(modules));
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (ModuleId m : groups[g].used_by)
      if (m >= 0 && m < modules) needs[static_cast<std::size_t>(m)].push_back(static_cast<int>(g));
  return needs;
}

namespace {

// Every module must fit under the live cap by itself.
void check_live_cap(const std::vector<std::vector<int>>& needs,
                    const std::vector<std::uint64_t>& size, std::uint64_t cap,
                    const std::vector<std::string>& names) {
  for (std::size_t m = 0; m < needs.size(); ++m) {
    std::uint64_t n = 0;
    for (int g : needs[m]) n += size[static_cast<std::size_t>(g)];
    if (n > cap)
      throw ConfigError("[strategy] max_live_parameters = " + std::to_string(cap) +
                        " is smaller than module " +
                        (m < names.size() ? "'" + names[m] + "'" : std::to_string(m)) +
                        ", which needs " + std::to_string(n) +
                        " gathered elements at once; raise it to at least " + std::to_string(n));
  }
}

}  // namespace

namespace {
std::vector<std::uint64_t> group_sizes(const std::vector<GatherGroup>& groups) {
  std::vector<std::uint64_t> sizes;
  for (const auto& g : groups) sizes.push_back(g.size());
  return sizes;
}
}  // namespace

StandardGathers standard_gathers(const std::vector<ParamSpec>& params, const FlatLayout& layout,
                                 const GatherOptions& options) {
  int modules = 1;
  for (const auto& p : params)
    for (auto m : p.used_by) modules = std::max(modules, m + 1);
  StandardGathers s;
  s.groups = gather_groups(params, layout, options.param_persistence_threshold);
  s.needs = group_needs(s.groups, modules);
  const auto sizes = group_sizes(s.groups);
  check_live_cap(s.needs, sizes, options.max_live_parameters, {});
  for (const auto& e : standard_trace(modules))
    s.trace.push_back(s.needs[static_cast<std::size_t>(e.module)]);
  s.plan = make_gather_plan(s.trace, sizes, options);
  return s;
}

GatherPeaks estimate_gather_peaks(const std::vector<ParamSpec>& params,
                                  const GatherOptions& options) {
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

ParamGatherer::ParamGatherer(Device& device, const std::vector<ParamSpec>& params,
                             const std::vector<ModuleSpec>& modules, const FlatLayout& layout,
                             Communicator& comm, OwnedShard& shard, const GatherOptions& options,
                             std::string strategy)
    : device_(device),
      comm_(comm),
      layout_(layout),
      shard_(shard),
      dtype_(shard.dtype()),
      options_(options),
      strategy_(std::move(strategy)),
      groups_(gather_groups(params, layout, options.param_persistence_threshold)) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto id = static_cast<ParamId>(i);
    params_.push_back({layout.offset(id), layout.numel(id), -1, params[i].shape});
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (ParamId p : groups_[g].params)
      params_[static_cast<std::size_t>(p)].group = static_cast<int>(g);
    live_groups_.emplace_back().counts = layout.owned_counts(groups_[g].begin, groups_[g].end);
  }
  for (const auto& m : modules) module_names_.push_back(m.name);
  needs_ = group_needs(groups_, static_cast<int>(modules.size()));
  check_live_cap(needs_, group_sizes(groups_), options.max_live_parameters, module_names_);
  if (!shard.resident() && options.read_buffer_size) check_read_buffers();
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

// Every group's part must fit one read buffer, on every rank: judged from
// all ranks' counts, so every rank refuses the same run.
void ParamGatherer::check_read_buffers() const {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& counts = live_groups_[g].counts;
    const std::uint64_t part = *std::max_element(counts.begin(), counts.end());
    if (part <= options_.read_buffer_size) continue;
    const ModuleId m = groups_[g].used_by.empty() ? -1 : groups_[g].used_by.front();
    throw ConfigError(
        "[strategy] offload_param.buffer_size = " + std::to_string(options_.read_buffer_size) +
        " elements is smaller than a rank's part of the parameters " +
        (m >= 0 && static_cast<std::size_t>(m) < module_names_.size()
             ? "'" + module_names_[static_cast<std::size_t>(m)] + "'"
             : std::string("of group ") + std::to_string(g)) +
        " gathers together (" + std::to_string(part) + " elements); raise it to at least " +
        std::to_string(part));
  }
}

void ParamGatherer::build_persistent() {
  persistent_at_.assign(params_.size(), 0);
  for (std::size_t p = 0; p < params_.size(); ++p) {
    if (params_[p].group >= 0) continue;
    persistent_at_[p] = persistent_elements_;
    persistent_elements_ += params_[p].numel;
  }
  persistent_ = device_.allocate(Tier::device, Category::params, bytes(persistent_elements_));
  for (int r = 0; r < layout_.world(); ++r) {
    std::size_t packed = 0;
    for (std::size_t p = 0; p < params_.size(); ++p) {
      if (params_[p].group >= 0) continue;
      const std::uint64_t b = std::max(params_[p].offset, layout_.owned_begin(r));
      const std::uint64_t e = std::min(params_[p].offset + params_[p].numel, layout_.owned_end(r));
      if (b >= e) continue;
      pieces_.push_back({static_cast<ParamId>(p), b, e});
      packed += e - b;
    }
    piece_counts_.push_back(packed);
  }
}

ShardLoan ParamGatherer::own_part(std::uint64_t begin, std::uint64_t end) {
  const std::uint64_t b = std::max(begin, shard_.begin()), e = std::min(end, shard_.end());
  return b < e ? shard_.lend(b, e) : ShardLoan{Buffer(), {nullptr, dtype_}};
}

void ParamGatherer::log(GatherEvent::Kind kind, int g) {
  if (log_) log_->push_back({kind, g, training_ ? position_ : -1, live_});
}

void ParamGatherer::gather(int id) {
  Live& g = live_groups_[static_cast<std::size_t>(id)];
  const GatherGroup& range = groups_[static_cast<std::size_t>(id)];
  if (g.state != State::released)
    throw InternalError(strategy_ + ": gather plan: group " + std::to_string(id) +
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

void ParamGatherer::wait(int id) {
  Live& g = live_groups_[static_cast<std::size_t>(id)];
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

void ParamGatherer::drop(int id) {
  Live& g = live_groups_[static_cast<std::size_t>(id)];
  if (g.state == State::released) return;
  wait(id);  // a buffer under a collective cannot go
  g.buffer.reset();
  g.state = State::released;
  live_ -= groups_[static_cast<std::size_t>(id)].size();
  log(GatherEvent::Kind::release, id);
}

void ParamGatherer::release_all() {
  for (std::size_t g = 0; g < live_groups_.size(); ++g) drop(static_cast<int>(g));
}

std::string ParamGatherer::describe(const TraceEntry& e) const {
  const auto m = static_cast<std::size_t>(e.module);
  return (m < module_names_.size() ? "'" + module_names_[m] + "'"
                                   : "module " + std::to_string(e.module)) +
         (e.backward ? " backward" : " forward");
}

void ParamGatherer::end_micro_step() {
  if (!training_) return;
  if (!recorded_) {
    std::vector<std::vector<int>> needs;
    for (const auto& e : trace_) needs.push_back(needs_[static_cast<std::size_t>(e.module)]);
    plan_ = make_gather_plan(needs, group_sizes(groups_), options_);
    recorded_ = true;
  } else if (static_cast<std::size_t>(position_) != trace_.size()) {
    throw Error(strategy_ + ": this micro-step ran " + std::to_string(position_) +
                " module passes, the first one " + std::to_string(trace_.size()) +
                " (next expected: " + describe(trace_[static_cast<std::size_t>(position_)]) +
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
  if (m < 0 || static_cast<std::size_t>(m) >= needs_.size())
    throw InternalError(strategy_ + ": fetch of module " + std::to_string(m) +
                        ", which the model did not declare");
  const auto& need = needs_[static_cast<std::size_t>(m)];
  const TraceEntry here{m, backward};
  if (training_ && recorded_) {
    const auto i = static_cast<std::size_t>(position_);
    if (i >= trace_.size() || !(trace_[i] == here))
      throw Error(strategy_ + ": the module order changed at position " + std::to_string(i) +
                  " of the micro-step: the first step ran " +
                  (i < trace_.size() ? describe(trace_[i]) : std::string("nothing more")) +
                  " there, this one " + describe(here) +
                  "; parameter prefetch follows the first step's module order, so the model must "
                  "run the same modules in the same order every step");
    for (int g : plan_.evict[i]) drop(g);
    for (int g : plan_.gather[i]) gather(g);
  } else {
    if (training_) trace_.push_back(here);
    for (int g : need)
      if (live_groups_[static_cast<std::size_t>(g)].state == State::released) gather(g);
  }
  for (int g : need) {
    if (live_groups_[static_cast<std::size_t>(g)].state == State::released)
      throw InternalError(strategy_ + ": gather plan: group " + std::to_string(g) + " needed by " +
                          describe(here) + " was not gathered");
    wait(g);
    log(GatherEvent::Kind::use, g);
  }
}

void ParamGatherer::release(ModuleId m, bool backward) {
  const auto i = static_cast<std::size_t>(position_);
  if (training_ && recorded_) {
    if (i >= trace_.size() || !(trace_[i] == TraceEntry{m, backward}))
      throw InternalError(strategy_ + ": release of " + describe({m, backward}) +
                          " without its fetch");
    for (int g : plan_.release[i]) drop(g);
    ++position_;
    return;
  }
  if (training_) ++position_;
  for (int g : needs_.at(static_cast<std::size_t>(m))) drop(g);
}

TensorView ParamGatherer::view(ParamId id) const {
  const Param& p = params_.at(static_cast<std::size_t>(id));
  if (p.group < 0) {
    const TypedPtr whole{persistent_.data(), dtype_};
    return {whole.at(persistent_at_[static_cast<std::size_t>(id)]).data, dtype_, p.shape};
  }
  const Live& g = live_groups_[static_cast<std::size_t>(p.group)];
  if (g.state != State::live)
    throw InternalError(strategy_ + ": parameter " + std::to_string(id) +
                        " viewed while not gathered: it is used by a module missing from its "
                        "used_by list");
  const TypedPtr whole{g.buffer.data(), dtype_};
  return {whole.at(p.offset - groups_[static_cast<std::size_t>(p.group)].begin).data, dtype_,
          p.shape};
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
    const Param& p = params_[static_cast<std::size_t>(piece.param)];
    device_.copy(
        whole.at(persistent_at_[static_cast<std::size_t>(piece.param)] + piece.begin - p.offset)
            .data,
        all.at(at).data, bytes(piece.end - piece.begin));
    at += piece.end - piece.begin;
  }
}

void ParamGatherer::read(ParamId id, float* out) {
  const Param& p = params_.at(static_cast<std::size_t>(id));
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
