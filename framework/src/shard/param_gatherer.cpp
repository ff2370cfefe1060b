#include "ztrain/shard/param_gatherer.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain::shard {

GatherPlan make_gather_plan(const std::vector<std::vector<ParamId>>& needs,
                            const std::vector<std::uint64_t>& numel, const GatherOptions& o) {
  const int T = static_cast<int>(needs.size());
  const std::size_t P = numel.size();
  GatherPlan plan;
  plan.evict.resize(needs.size());
  plan.gather.resize(needs.size());
  plan.release.resize(needs.size());
  if (T == 0) return plan;
  auto size = [&](ParamId p) { return numel[static_cast<std::size_t>(p)]; };
  std::vector<std::vector<int>> uses(P);
  for (int i = 0; i < T; ++i)
    for (ParamId p : needs[static_cast<std::size_t>(i)])
      uses[static_cast<std::size_t>(p)].push_back(i);
  auto next_use = [&](ParamId p, int i) {
    const auto& u = uses[static_cast<std::size_t>(p)];
    const auto it = std::upper_bound(u.begin(), u.end(), i);
    return it == u.end() ? INT_MAX : *it;
  };
  std::vector<char> live(P, 0);
  // The last position a fetch or a prefetch scan counted on the parameter
  // being gathered: releasing it earlier would undo that prefetch.
  std::vector<int> claimed(P, -1);
  std::vector<int> keep(P, -1);
  std::uint64_t total = 0;
  for (int i = 0; i < T; ++i) {
    const auto& need = needs[static_cast<std::size_t>(i)];
    auto in_need = [&](ParamId p) { return std::find(need.begin(), need.end(), p) != need.end(); };
    std::uint64_t missing = 0;
    for (ParamId p : need)
      if (!live[static_cast<std::size_t>(p)]) missing += size(p);
    while (total + missing > o.max_live_parameters) {
      ParamId victim = -1;
      int farthest = -1;
      for (std::size_t q = 0; q < P; ++q) {
        const auto p = static_cast<ParamId>(q);
        if (!live[q] || in_need(p)) continue;
        const int next = next_use(p, i);
        if (next > farthest) farthest = next, victim = p;
      }
      if (victim < 0) break;  // only the needs are live: they fit by contract
      live[static_cast<std::size_t>(victim)] = 0;
      claimed[static_cast<std::size_t>(victim)] = -1;
      total -= size(victim);
      plan.evict[static_cast<std::size_t>(i)].push_back(victim);
    }
    for (ParamId p : need) {
      auto q = static_cast<std::size_t>(p);
      if (!live[q]) {
        live[q] = 1;
        total += size(p);
        plan.gather[static_cast<std::size_t>(i)].push_back(p);
      }
      claimed[q] = std::max(claimed[q], i);
    }
    std::uint64_t budget = o.prefetch_bucket_size;
    bool full = budget == 0;
    for (int j = i + 1; j < T && !full; ++j)
      for (ParamId p : needs[static_cast<std::size_t>(j)]) {
        auto q = static_cast<std::size_t>(p);
        if (live[q]) {
          claimed[q] = std::max(claimed[q], j);
          continue;
        }
        if (size(p) > budget || total + size(p) > o.max_live_parameters) {
          full = true;
          break;
        }
        live[q] = 1;
        total += size(p);
        budget -= size(p);
        claimed[q] = j;
        plan.gather[static_cast<std::size_t>(i)].push_back(p);
      }
    plan.peak_live = std::max(plan.peak_live, total);
    std::uint64_t traversed = 0;
    for (int j = i + 1; j < T && traversed < o.max_reuse_distance; ++j)
      for (ParamId p : needs[static_cast<std::size_t>(j)]) {
        keep[static_cast<std::size_t>(p)] = i;
        traversed += size(p);
      }
    for (ParamId p : need) {
      auto q = static_cast<std::size_t>(p);
      if (!live[q] || claimed[q] > i || keep[q] == i) continue;
      live[q] = 0;
      total -= size(p);
      plan.release[static_cast<std::size_t>(i)].push_back(p);
    }
  }
  for (std::size_t q = 0; q < P; ++q)
    if (live[q]) plan.release.back().push_back(static_cast<ParamId>(q));
  return plan;
}

std::vector<TraceEntry> standard_trace(int modules) {
  std::vector<TraceEntry> t;
  for (int m = 0; m < modules; ++m) t.push_back({m, false});
  for (int m = modules; m-- > 0;) t.push_back({m, true});
  return t;
}

std::vector<std::vector<ParamId>> module_needs(const std::vector<ParamSpec>& params, int modules,
                                               std::uint64_t persistence_threshold) {
  std::vector<std::vector<ParamId>> needs(static_cast<std::size_t>(modules));
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (static_cast<std::uint64_t>(params[p].shape.numel()) <= persistence_threshold) continue;
    for (ModuleId m : params[p].used_by)
      if (m >= 0 && m < modules)
        needs[static_cast<std::size_t>(m)].push_back(static_cast<ParamId>(p));
  }
  return needs;
}

namespace {

// Every module must fit under the live cap by itself.
void check_live_cap(const std::vector<std::vector<ParamId>>& needs,
                    const std::vector<std::uint64_t>& numel, std::uint64_t cap,
                    const std::vector<std::string>& names) {
  for (std::size_t m = 0; m < needs.size(); ++m) {
    std::uint64_t n = 0;
    for (ParamId p : needs[m]) n += numel[static_cast<std::size_t>(p)];
    if (n > cap)
      throw ConfigError("[strategy] max_live_parameters = " + std::to_string(cap) +
                        " is smaller than module " +
                        (m < names.size() ? "'" + names[m] + "'" : std::to_string(m)) +
                        ", which needs " + std::to_string(n) +
                        " gathered elements at once; raise it to at least " + std::to_string(n));
  }
}

}  // namespace

GatherPeaks estimate_gather_peaks(const std::vector<ParamSpec>& params,
                                  const GatherOptions& options) {
  int modules = 1;
  GatherPeaks peaks;
  std::vector<std::uint64_t> numel;
  for (const auto& p : params) {
    for (auto m : p.used_by) modules = std::max(modules, m + 1);
    numel.push_back(static_cast<std::uint64_t>(p.shape.numel()));
    if (numel.back() <= options.param_persistence_threshold) peaks.persistent += numel.back();
  }
  const auto needs = module_needs(params, modules, options.param_persistence_threshold);
  check_live_cap(needs, numel, options.max_live_parameters, {});
  std::vector<std::vector<ParamId>> trace;
  for (const auto& e : standard_trace(modules))
    trace.push_back(needs[static_cast<std::size_t>(e.module)]);
  peaks.live = make_gather_plan(trace, numel, options).peak_live;
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
                             Communicator& comm, TypedPtr shard, const GatherOptions& options)
    : device_(device), comm_(comm), layout_(layout), shard_(shard), options_(options) {
  const int rank = comm.rank();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto id = static_cast<ParamId>(i);
    Param p;
    p.offset = layout.offset(id);
    p.numel = layout.numel(id);
    p.counts = layout.owned_counts(p.offset, p.offset + p.numel);
    p.own_begin = std::max(p.offset, layout.owned_begin(rank));
    p.persistent = p.numel <= options.param_persistence_threshold;
    p.shape = params[i].shape;
    if (p.persistent) persistent_elements_ += p.numel;
    params_.push_back(std::move(p));
  }
  for (const auto& m : modules) module_names_.push_back(m.name);
  needs_ =
      module_needs(params, static_cast<int>(modules.size()), options.param_persistence_threshold);
  std::vector<std::uint64_t> numel;
  for (const auto& p : params_) numel.push_back(p.numel);
  check_live_cap(needs_, numel, options.max_live_parameters, module_names_);
  for (auto& p : params_)
    if (p.persistent) p.buffer = device.allocate(Tier::device, Category::params, bytes(p.numel));
  refresh();
}

ParamGatherer::~ParamGatherer() {
  for (auto& p : params_) {
    if (p.state != State::in_flight) continue;
    try {
      p.work.wait();
    } catch (...) {  // an error on the way out: the buffer must outlive the collective anyway
    }
  }
}

void* ParamGatherer::own_part(const Param& p) const {
  if (p.counts[static_cast<std::size_t>(comm_.rank())] == 0) return shard_.data;
  return shard_.at(p.own_begin - layout_.owned_begin(comm_.rank())).data;
}

void ParamGatherer::log(GatherEvent::Kind kind, ParamId p) {
  if (log_) log_->push_back({kind, p, training_ ? position_ : -1, live_});
}

void ParamGatherer::gather(ParamId id) {
  Param& p = params_[static_cast<std::size_t>(id)];
  if (p.state != State::released)
    throw InternalError("gather plan: parameter " + std::to_string(id) + " is already gathered");
  p.buffer = device_.allocate(Tier::device, Category::params, bytes(p.numel));
  p.work = comm_.all_gather_v_async(own_part(p), p.buffer.data(), p.counts, shard_.dtype);
  p.state = State::in_flight;
  live_ += p.numel;
  log(GatherEvent::Kind::gather, id);
}

void ParamGatherer::wait(ParamId id) {
  Param& p = params_[static_cast<std::size_t>(id)];
  if (p.state != State::in_flight) return;
  const auto t0 = std::chrono::steady_clock::now();
  p.work.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.work = {};
  p.state = State::live;
}

void ParamGatherer::drop(ParamId id) {
  Param& p = params_[static_cast<std::size_t>(id)];
  if (p.persistent || p.state == State::released) return;
  wait(id);  // a buffer under a collective cannot go
  p.buffer.reset();
  p.state = State::released;
  live_ -= p.numel;
  log(GatherEvent::Kind::release, id);
}

void ParamGatherer::release_all() {
  for (std::size_t i = 0; i < params_.size(); ++i) drop(static_cast<ParamId>(i));
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
    std::vector<std::vector<ParamId>> needs;
    std::vector<std::uint64_t> numel;
    for (const auto& e : trace_) needs.push_back(needs_[static_cast<std::size_t>(e.module)]);
    for (const auto& p : params_) numel.push_back(p.numel);
    plan_ = make_gather_plan(needs, numel, options_);
    recorded_ = true;
  } else if (static_cast<std::size_t>(position_) != trace_.size()) {
    throw Error("zero3: this micro-step ran " + std::to_string(position_) +
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
    throw InternalError("fetch of module " + std::to_string(m) +
                        ", which the model did not declare");
  const auto& need = needs_[static_cast<std::size_t>(m)];
  const TraceEntry here{m, backward};
  if (training_ && recorded_) {
    const auto i = static_cast<std::size_t>(position_);
    if (i >= trace_.size() || !(trace_[i] == here))
      throw Error("zero3: the module order changed at position " + std::to_string(i) +
                  " of the micro-step: the first step ran " +
                  (i < trace_.size() ? describe(trace_[i]) : std::string("nothing more")) +
                  " there, this one " + describe(here) +
                  "; parameter prefetch follows the first step's module order, so the model must "
                  "run the same modules in the same order every step");
    for (ParamId p : plan_.evict[i]) drop(p);
    for (ParamId p : plan_.gather[i]) gather(p);
  } else {
    if (training_) trace_.push_back(here);
    for (ParamId p : need)
      if (params_[static_cast<std::size_t>(p)].state == State::released) gather(p);
  }
  for (ParamId p : need) {
    if (params_[static_cast<std::size_t>(p)].state == State::released)
      throw InternalError("gather plan: parameter " + std::to_string(p) + " needed by " +
                          describe(here) + " was not gathered");
    wait(p);
    log(GatherEvent::Kind::use, p);
  }
}

void ParamGatherer::release(ModuleId m, bool backward) {
  const auto i = static_cast<std::size_t>(position_);
  if (training_ && recorded_) {
    if (i >= trace_.size() || !(trace_[i] == TraceEntry{m, backward}))
      throw InternalError("release of " + describe({m, backward}) + " without its fetch");
    for (ParamId p : plan_.release[i]) drop(p);
    ++position_;
    return;
  }
  if (training_) ++position_;
  for (ParamId p : needs_.at(static_cast<std::size_t>(m))) drop(p);
}

TensorView ParamGatherer::view(ParamId id) const {
  const Param& p = params_.at(static_cast<std::size_t>(id));
  if (!p.persistent && p.state != State::live)
    throw InternalError("parameter " + std::to_string(id) +
                        " viewed while not gathered: it is used by a module missing from its "
                        "used_by list");
  return {p.buffer.data(), shard_.dtype, p.shape};
}

void ParamGatherer::refresh() {
  std::vector<CommWork> works;
  for (auto& p : params_) {
    if (!p.persistent) continue;
    works.push_back(comm_.all_gather_v_async(own_part(p), p.buffer.data(), p.counts, shard_.dtype));
  }
  const auto t0 = std::chrono::steady_clock::now();
  wait_all(works);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ParamGatherer::read(ParamId id, float* out) {
  const Param& p = params_.at(static_cast<std::size_t>(id));
  if (shard_.dtype == DType::f32) {
    comm_.all_gather_v_async(own_part(p), out, p.counts, DType::f32).wait();
    return;
  }
  std::vector<std::uint16_t> whole(p.numel);
  comm_.all_gather_v_async(own_part(p), whole.data(), p.counts, shard_.dtype).wait();
  convert(whole.data(), shard_.dtype, out, DType::f32, p.numel);
}

void ParamGatherer::write(ParamId id, const float* in) {
  Param& p = params_.at(static_cast<std::size_t>(id));
  const std::uint64_t mine = p.counts[static_cast<std::size_t>(comm_.rank())];
  if (mine > 0) convert(in + (p.own_begin - p.offset), DType::f32, own_part(p), shard_.dtype, mine);
  if (p.persistent || p.state == State::live)
    convert(in, DType::f32, p.buffer.data(), shard_.dtype, p.numel);
}

}  // namespace ztrain::shard
