// The shard toolkit's schedulers at world 1 (the local communicator): the
// gather plan and the gatherer's trace, prefetch, live cap and order check;
// the reduction plans of every policy, and the gradient reducer executing
// one, its memory against the plan's peaks; the swapped optimizer's
// automatic sub-group size.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "support.h"
#include "ztrain/comm.h"
#include "ztrain/error.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/param_store.h"
#include "ztrain/shard/reduce_plan.h"
#include "ztrain/shard/swapped_optimizer.h"

using namespace ztrain;
using namespace ztrain::id_literals;
using shard::GatherEvent;

namespace {

ParamSpec spec(std::string name, std::int64_t n, std::vector<ModuleId> used_by) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = {n};
  p.init = {Init::Kind::normal, 1.0f};
  p.used_by = std::move(used_by);
  return p;
}

// `n` modules of one 100-element parameter each, plus a 60-element
// parameter tied between the first and the last (as a tied embedding).
ParamSpecs chain(std::size_t n = 4) {
  ParamSpecs out;
  out.push_back(spec("tied", 60, {0_module, id_at<ModuleId>(n - 1)}));
  for (ModuleId m : first_ids<ModuleId>(n)) out.push_back(spec("m" + to_string(m), 100, {m}));
  return out;
}
ModuleSpecs modules() {
  return {{"embed"}, {"block.0"}, {"block.1"}, {"head"}};
}

void run_micro_step(shard::ParamGatherer& g, std::size_t n_modules) {
  g.begin_micro_step();
  for (const auto& e : shard::standard_trace(n_modules)) {
    g.fetch(e.module, e.backward);
    g.release(e.module, e.backward);
  }
}

}  // namespace

TEST_CASE("stores draw first values from the seed, or leave them for a load") {
  // A resume or [model] init_from loads every parameter right after setup:
  // no seed, nothing drawn (zeros until the load).
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  const auto params = chain();
  const shard::FlatLayout layout(params, 1);
  const auto drawn_somewhere = [](const float* v, std::uint64_t n) {
    return std::any_of(v, v + n, [](float x) { return x != 0.0f; });
  };
  shard::FullReplica seeded(*dev, params, layout, 5, DType::f32, std::nullopt);
  shard::FullReplica unseeded(*dev, params, layout, std::nullopt, DType::f32, std::nullopt);
  std::vector<float> want(layout.total());
  shard::init_flat(params, layout, 5, 0, layout.total(), want.data());
  CHECK(std::equal(want.begin(), want.end(), static_cast<const float*>(seeded.weights().data)));
  CHECK(!drawn_somewhere(static_cast<const float*>(unseeded.weights().data), layout.total()));
  shard::ShardedParams sharded(*dev, params, modules(), layout, *comm, std::nullopt, DType::f32, {},
                               {}, "test");
  CHECK(
      !drawn_somewhere(static_cast<const float*>(sharded.owned().resident().data), layout.total()));
  shard::ShardedParams sharded_seeded(*dev, params, modules(), layout, *comm, 5, DType::f32, {}, {},
                                      "test");
  CHECK(std::equal(want.begin(), want.end(),
                   static_cast<const float*>(sharded_seeded.owned().resident().data)));
}

TEST_CASE("gather plan: prefetch ahead within its budget, never above the live cap") {
  const auto params = chain();
  const auto groups = shard::gather_groups(params, shard::FlatLayout(params, 1), 0);
  REQUIRE(groups.size() == params.size());  // no two neighbours share their modules
  const auto needs0 = shard::group_needs(groups, 4);
  std::vector<std::vector<GroupId>> needs;
  for (const auto& e : shard::standard_trace(4)) needs.push_back(needs0[e.module]);
  const IdVector<GroupId, std::uint64_t> numel{60, 100, 100, 100, 100};
  const auto plan = shard::make_gather_plan(needs, numel, {150, 260, 0, 0});
  // Position 0 gathers its own two parameters and prefetches m1 (100 fits
  // the 150 budget; m2 would not).
  CHECK(plan.gather[0] == std::vector<GroupId>{0_group, 1_group, 2_group});
  CHECK(plan.peak_live <= 260);
  // Everything gathered is released by the end of the micro-step.
  IdVector<GroupId, int> balance(5, 0);
  for (std::size_t i = 0; i < needs.size(); ++i) {
    for (GroupId g : plan.gather[i]) ++balance[g];
    for (GroupId g : plan.evict[i]) --balance[g];
    for (GroupId g : plan.release[i]) --balance[g];
  }
  CHECK(std::all_of(balance.begin(), balance.end(), [](int b) { return b == 0; }));
  // With reuse allowed, the head's parameters stay gathered from its forward
  // into its backward.
  const auto reuse = shard::make_gather_plan(needs, numel, {0, 1000, 0, 1000});
  CHECK(reuse.gather[4].empty());
}

TEST_CASE("gather groups: one per module's run of parameters, small ones riding along") {
  // A GPT-2-like layout: a tied embedding, positions, two blocks of
  // matrices with small biases and norms between them, a final norm.
  ParamSpecs params{spec("wte", 640, {0_module, 3_module}), spec("wpe", 320, {0_module})};
  for (ModuleId m : {1_module, 2_module})
    for (auto [name, n] : {std::pair{"ln.w", 16},
                           {"qkv.w", 768},
                           {"qkv.b", 48},
                           {"proj.w", 256},
                           {"proj.b", 16},
                           {"fc.w", 1024},
                           {"fc.b", 64}})
      params.push_back(spec(name, n, {m}));
  params.push_back(spec("ln_f.w", 16, {3_module}));
  const shard::FlatLayout layout(params, 2);
  for (std::uint64_t threshold : {std::uint64_t{0}, std::uint64_t{100}}) {
    const auto groups = shard::gather_groups(params, layout, threshold);
    INFO("threshold " << threshold);
    // wte, wpe, one per block; the final norm only when it is not persistent.
    CHECK(groups.size() == (threshold == 0 ? 5u : 4u));
    CHECK(groups[2_group].used_by == std::vector<ModuleId>{1_module});
    CHECK(groups[2_group].begin == layout.offset(threshold == 0 ? 2_param : 3_param));
    // From the first to the last non-persistent parameter of block 1.
    CHECK(groups[2_group].end ==
          (threshold == 0 ? layout.offset(8_param) + 64 : layout.offset(7_param) + 1024));
    CHECK(groups[2_group].params.size() == (threshold == 0 ? 7u : 3u));
    const auto needs = shard::group_needs(groups, 4);
    CHECK(needs[0_module] == std::vector<GroupId>{0_group, 1_group});
    CHECK(needs[3_module].front() == 0_group);  // the tied embedding again
  }
}

TEST_CASE("gatherer: a trace is recorded, later steps prefetch ahead of use under the cap") {
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  const auto params = chain();
  const shard::FlatLayout layout(params, 1);
  std::vector<float> weights(layout.total());
  shard::init_flat(params, layout, 7, 0, layout.total(), weights.data());
  const shard::GatherOptions opts{200, 260, 0, 0};
  shard::ResidentShard owned(*dev, 0, layout.total(), weights.data(), Tier::device);
  shard::ParamGatherer g(*dev, params, modules(), layout, *comm, owned, opts, "test");
  std::vector<GatherEvent> log;
  g.record_events(&log);
  run_micro_step(g, 4);
  CHECK(g.plan() == nullptr);
  g.end_step();
  REQUIRE(g.plan() != nullptr);
  log.clear();
  for (int step = 0; step < 2; ++step) {
    run_micro_step(g, 4);
    g.end_step();
    // Outside training (evaluation) fetches are on demand; the gathered
    // values are the shard's.
    g.fetch(0_module, false);
    CHECK(std::equal(weights.begin() + static_cast<std::ptrdiff_t>(layout.offset(1_param)),
                     weights.begin() + static_cast<std::ptrdiff_t>(layout.offset(1_param) + 100),
                     g.view(1_param).f32()));
    g.release(0_module, false);
  }
  int ahead = 0, uses = 0;
  for (std::size_t k = 0; k < log.size(); ++k) {
    CHECK(log[k].live <= opts.max_live_parameters);
    if (log[k].kind != GatherEvent::Kind::use || log[k].position.value_or(0) == 0) continue;
    ++uses;
    // The latest gather of this parameter before its use.
    for (std::size_t j = k; j-- > 0;)
      if (log[j].kind == GatherEvent::Kind::gather && log[j].group == log[k].group) {
        if (log[j].position < log[k].position) ++ahead;
        break;
      }
  }
  CHECK(uses > 0);
  CHECK(ahead == uses);  // every use after the first module was prefetched
  CHECK(dev->stats().peak[Tier::device][Category::params] <= (260 + 0) * sizeof(float));
}

TEST_CASE("gatherer: a changed module order is an error naming both modules") {
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  const auto params = chain();
  const shard::FlatLayout layout(params, 1);
  std::vector<float> weights(layout.total(), 0.5f);
  shard::ResidentShard owned(*dev, 0, layout.total(), weights.data(), Tier::device);
  shard::ParamGatherer g(*dev, params, modules(), layout, *comm, owned, {1000, 1000, 0, 0}, "test");
  run_micro_step(g, 4);
  g.begin_micro_step();
  g.fetch(0_module, false);
  g.release(0_module, false);
  const std::string msg = test::message_of<Error>([&] { g.fetch(2_module, false); });
  CHECK(msg.find("module order changed at position 1") != std::string::npos);
  CHECK(msg.find("'block.0' forward") != std::string::npos);
  CHECK(msg.find("'block.1' forward") != std::string::npos);
}

TEST_CASE("gatherer: a module larger than max_live_parameters is refused up front") {
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  const auto params = chain();
  const shard::FlatLayout layout(params, 1);
  std::vector<float> weights(layout.total());
  shard::ResidentShard owned(*dev, 0, layout.total(), weights.data(), Tier::device);
  const std::string msg = test::message_of<ConfigError>([&] {
    shard::ParamGatherer g(*dev, params, modules(), layout, *comm, owned, {0, 120, 0, 0}, "test");
  });
  CHECK(msg.find("max_live_parameters = 120") != std::string::npos);
  CHECK(msg.find("'embed'") != std::string::npos);
}

TEST_CASE("reduction plans: every bucket launched once, in order, when complete, and waited once") {
  const auto params = chain(8);
  for (int world : {1, 3}) {
    const shard::FlatLayout layout(params, world);
    for (auto policy : {shard::ReducePolicy::replicate, shard::ReducePolicy::shard_after_backward,
                        shard::ReducePolicy::shard_during_backward})
      for (bool overlap : {false, true}) {
        const auto plan = shard::make_reduce_plan(params, layout, policy, {120, 50, overlap});
        INFO("policy " << static_cast<int>(policy) << " overlap " << overlap << " world " << world);
        REQUIRE(plan.buckets.size() > 2);
        CHECK(plan.buckets.front().range.end == layout.total());
        CHECK(plan.buckets.back().range.begin == 0);
        const bool every = policy == shard::ReducePolicy::shard_during_backward;
        // Accumulating micro-steps reduce only under shard_during_backward.
        std::size_t accumulating = plan.accumulating.at_end.size();
        for (const auto& a : plan.accumulating.after_module) accumulating += a.size();
        CHECK((accumulating > 0) == every);
        for (const auto* sched : {&plan.accumulating, &plan.last}) {
          if (sched == &plan.accumulating && !every) continue;
          // 0 idle, 1 launched, 2 waited
          IdVector<BucketId, int> state(plan.buckets.size(), 0);
          BucketId next_launch{};
          const auto act = [&](const shard::ReduceAction& a, ModuleId after) {
            auto& st = state[a.bucket];
            if (a.kind == shard::ReduceAction::Kind::launch) {
              CHECK(st == 0);
              CHECK(a.bucket == next_launch);
              next_launch = next_id(next_launch);
              // Complete: every parameter in it was done by this module.
              for (ParamId p : params.ids())
                if (plan.bucket_of[p] == a.bucket)
                  CHECK(*std::min_element(params[p].used_by.begin(), params[p].used_by.end()) >=
                        after);
              st = 1;
            } else {
              CHECK(st == 1);
              st = 2;
            }
          };
          for (std::size_t i = 8; i-- > 0;)
            for (const auto& a : sched->after_module[id_at<ModuleId>(i)])
              act(a, id_at<ModuleId>(i));
          for (const auto& a : sched->at_end) act(a, 0_module);
          for (int st : state) CHECK(st == 2);
        }
        const auto peaks = shard::worst_reduce_peaks(plan, world);
        CHECK((peaks.staged > 0) == every);
        CHECK((peaks.recv > 0) == (policy != shard::ReducePolicy::replicate));
        CHECK(peaks.staged < layout.total());
      }
  }
}

namespace {

// A chain of `modules` modules at world 1, its gradients reduced into one
// shard during backward (buckets of 120 elements, the first of 50).
struct ReducerSetup {
  explicit ReducerSetup(std::size_t modules,
                        shard::ReducePolicy policy = shard::ReducePolicy::shard_during_backward)
      : params(chain(modules)),
        layout(params, 1),
        shard(layout.total(), 0.0f),
        plan(shard::make_reduce_plan(params, layout, policy, {120, 50, true})) {}
  shard::GradReducer reducer(Device& dev, Communicator& comm) {
    return shard::GradReducer(dev, params, layout, comm, plan, DType::f32, {},
                              std::vector<shard::GradPiece>{{0, layout.total(), shard.data()}},
                              "test");
  }
  ParamSpecs params;
  shard::FlatLayout layout;
  std::vector<float> shard;
  shard::ReducePlan plan;
};

}  // namespace

TEST_CASE("the gradient reducer refuses a backward that skips or repeats a module") {
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  ReducerSetup setup(4);
  shard::GradReducer r = setup.reducer(*dev, *comm);
  r.begin_micro_step(true);
  r.module_done(3_module);
  // Module 2's backward is due; 1 skips it.
  std::string why = test::message_of<InternalError>([&] { r.module_done(1_module); });
  CHECK(why.find("backward ran module 1 where module 2 was due") != std::string::npos);
  r.begin_micro_step(true);
  for (ModuleId m : {3_module, 2_module, 1_module, 0_module}) r.module_done(m);
  // Every module is done: a second backward of the first one is refused.
  why = test::message_of<InternalError>([&] { r.module_done(0_module); });
  CHECK(why.find("where none was due") != std::string::npos);
  r.finish();
}

TEST_CASE("an accumulating micro-step that reduces nothing takes its modules in any order") {
  // ddp's and zero1's: a pipeline stage's backwards run only its chunk's
  // modules, as often as its schedule says (the last micro-step is checked
  // as any: above).
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  for (const auto policy :
       {shard::ReducePolicy::replicate, shard::ReducePolicy::shard_after_backward}) {
    ReducerSetup setup(4, policy);
    CHECK(setup.plan.accumulating.empty());
    CHECK_FALSE(setup.plan.last.empty());
    shard::GradReducer r = setup.reducer(*dev, *comm);
    r.begin_micro_step(false);
    for (ModuleId m : {1_module, 0_module, 3_module, 1_module}) r.module_done(m);
    r.begin_micro_step(false);
    r.module_done(2_module);
  }
  CHECK_FALSE(ReducerSetup(4).plan.accumulating.empty());  // zero2's reduces every micro-step
}

TEST_CASE("the gradient reducer accumulates micro-steps into the shard, memory as its plan says") {
  auto dev = make_cpu_device(1);
  auto comm = make_local_communicator();
  ReducerSetup setup(8);
  const auto& [params, layout, shard, plan] = setup;
  const auto peaks = shard::reduce_peaks(plan, 0);
  shard::GradReducer r = setup.reducer(*dev, *comm);
  for (int micro = 0; micro < 2; ++micro) {
    r.begin_micro_step(micro == 1);
    for (std::size_t mi = 8; mi-- > 0;) {
      const auto m = id_at<ModuleId>(mi);
      for (ParamId p : params.ids()) {
        const auto& u = params[p].used_by;
        if (std::find(u.begin(), u.end(), m) == u.end()) continue;
        TensorView g = r.grad(p);
        for (std::int64_t i = 0; i < g.numel(); ++i)
          g.f32()[i] += static_cast<float>(index_of(p) + 1);
      }
      r.module_done(m);
    }
  }
  r.finish();
  for (ParamId p : params.ids()) {
    // Two micro-steps; the tied parameter gets a gradient from both users.
    const float want = 2.0f * static_cast<float>(index_of(p) + 1) * (p == 0_param ? 2.0f : 1.0f);
    CHECK(shard[layout.offset(p)] == want);
  }
  const auto peak = [&](Category c) { return dev->stats().peak[Tier::device][c]; };
  CHECK(peaks.staged < layout.total());  // never all gradients at once
  CHECK(peak(Category::grads) == peaks.staged * sizeof(float));
  CHECK(peak(Category::comm) == peaks.recv * sizeof(float));
  // Modules out of order are refused, naming the caller.
  r.begin_micro_step(true);
  CHECK(test::message_of<InternalError>([&] {
          r.module_done(3_module);
        }).find("test: backward ran module 3") == 0);
}

TEST_CASE("sub_group_size auto: a sixteenth of the shard, within its floor, ceiling and RAM") {
  using shard::SwappedOptimizer;
  const std::uint64_t gib = std::uint64_t{1} << 30, floor = std::uint64_t{1} << 22;
  // gpt2-124m at one rank: 124439808 / 16 = 7777488, rounded up to whole
  // pages of elements (2048).
  CHECK(SwappedOptimizer::auto_sub_group(124439808, 4, DType::f32, 24 * gib) == 7778304);
  // A small shard still streams at least 2^22 elements a transfer.
  CHECK(SwappedOptimizer::auto_sub_group(1000000, 4, DType::f32, 24 * gib) == floor);
  // A huge shard: at most DeepSpeed's 1e9 (rounded to pages) with the RAM
  // unknown, and at most an eighth of the RAM across the buffers: 4
  // buffers of 14 bytes per element (masters, m, v and a bf16 working copy).
  CHECK(SwappedOptimizer::auto_sub_group(std::uint64_t{1} << 36, 4, DType::bf16, 0) ==
        SwappedOptimizer::sub_group_elements(1000000000));
  const std::uint64_t capped =
      SwappedOptimizer::auto_sub_group(3820710912, 4, DType::bf16, 24 * gib);
  CHECK(capped == SwappedOptimizer::sub_group_elements(24 * gib / 8 / 56));
  CHECK(capped * 56 <= 24 * gib / 8 + 2048 * 56);
  // Fewer buffers, larger sub-groups within the same share.
  CHECK(SwappedOptimizer::auto_sub_group(3820710912, 2, DType::bf16, 24 * gib) ==
        SwappedOptimizer::sub_group_elements(24 * gib / 8 / 28));
  // The RAM wins over the floor: 1 GiB leaves 128 MiB for 4 buffers of 16
  // bytes per element.
  CHECK(SwappedOptimizer::auto_sub_group(1000000, 4, DType::f32, gib) == 2097152);
}
