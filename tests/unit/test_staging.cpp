// The paths host code takes to memory it cannot touch (a GPU's), run on
// the CPU: a device whose device tier claims not to be host-visible (its
// memory is still RAM, so results can be compared) must give the same
// bits as the cpu device through every staged path, and must actually
// take those paths (its copies and conversions are counted).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/optimizer_shard.h"
#include "ztrain/shard/shard_optimizer.h"

using namespace ztrain;
using namespace ztrain::id_literals;

namespace {

// RAM that claims its device tier is out of the host's reach, as a GPU's
// is (the tests still read it, to compare).
class UnreachableRam : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  int threads() const override { return 1; }
  bool host_visible(Tier tier) const override { return tier != Tier::device; }

 protected:
  void* raw_allocate(Tier, Category, std::size_t bytes, Fill fill) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (fill == Fill::zeros) std::memset(p, 0, bytes);
    return p;
  }
  void raw_free(Tier, Category, void* p, std::size_t) noexcept override { std::free(p); }
};

// Counts what goes through the device's movers.
class OpaqueDevice final : public UnreachableRam {
 public:
  int copies = 0, converts = 0;
  std::string name() const override { return "opaque"; }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    ++copies;
    Device::copy(dst, src, bytes);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) override {
    ++converts;
    Device::convert(dst, src, n);
  }
};

// Asynchronous copies that happen only when they are waited for (a GPU's
// copy stream at its slowest): code that reads a destination, or reuses a
// source, before wait() sees the difference.
class LaggingDevice final : public UnreachableRam {
 public:
  int started = 0;
  std::string name() const override { return "lagging"; }
  CopyWork copy_async(void* dst, const void* src, std::size_t bytes) override {
    ++started;
    auto done = std::make_shared<bool>(false);
    return CopyWork(
        [dst, src, bytes, done] {
          std::memcpy(dst, src, bytes);
          *done = true;
        },
        [done] { return *done; });
  }
};

ParamSpecs params() {
  ParamSpecs out;
  for (auto [name, rows, cols] : {std::tuple{"a", 300, 70}, {"b", 1, 513}, {"c", 1000, 9}}) {
    ParamSpec p;
    p.name = name;
    p.shape = {rows, cols};
    p.init = {Init::Kind::normal, 0.5f};
    p.used_by = {0_module};
    out.push_back(p);
  }
  return out;
}

// Every put, in order, with its values.
struct Recorder final : StateSink {
  std::vector<std::tuple<ParamId, std::uint64_t, std::uint64_t, StateArray, std::vector<float>>>
      puts;
  void put(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
           const float* values) override {
    puts.emplace_back(p, first, count, a, std::vector<float>(values, values + count));
  }
};

// Hands out element i of parameter p of array a as a function of them.
struct Formula final : StateSource {
  void get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a, float* out) override {
    for (std::uint64_t i = 0; i < count; ++i)
      out[i] = static_cast<float>(p) * 1000.0f + static_cast<float>(a) * 0.25f +
               static_cast<float>(first + i) * 1e-3f;
  }
};

}  // namespace

TEST_CASE("initial values reach an unreachable device tier through copies, the same bits") {
  const auto ps = params();
  const shard::FlatLayout layout(ps, 1);
  auto cpu = make_cpu_device(1);
  OpaqueDevice opaque;
  for (DType t : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(t));
    const shard::FullReplica a(*cpu, ps, layout, 17, t, DType::f32);
    const int before = opaque.converts;
    const shard::FullReplica b(opaque, ps, layout, 17, t, DType::f32);
    CHECK(opaque.converts > before);  // staged, not written in place
    CHECK(std::memcmp(a.weights().data, b.weights().data, layout.total() * dtype_size(t)) == 0);
    std::vector<float> ra(static_cast<std::size_t>(layout.numel(1_param))), rb(ra.size());
    a.read(1_param, ra.data());
    b.read(1_param, rb.data());
    CHECK(ra == rb);
  }
}

TEST_CASE("optimizer state saves and loads through host staging with the same bits") {
  const auto ps = params();
  const shard::FlatLayout layout(ps, 2, 64);
  const std::uint64_t begin = layout.owned_begin(1), end = layout.owned_end(1);
  const OptimizerSettings settings{0.9, 0.95, 1e-8, 0.1};
  auto cpu = make_cpu_device(1);
  OpaqueDevice opaque;
  std::vector<std::uint16_t> w_cpu(end - begin), w_opq(end - begin);
  for (std::size_t i = 0; i < w_cpu.size(); ++i) w_cpu[i] = w_opq[i] = float_to_bf16(0.01f * i);
  shard::OptimizerShard a(*cpu, Tier::device, ps, layout, begin, end, settings,
                          {w_cpu.data(), DType::bf16});
  shard::OptimizerShard b(opaque, Tier::device, ps, layout, begin, end, settings,
                          {w_opq.data(), DType::bf16});
  Formula source;
  a.load(source, layout, {w_cpu.data(), DType::bf16});
  const int copies = opaque.copies;
  b.load(source, layout, {w_opq.data(), DType::bf16});
  CHECK(opaque.copies > copies);
  CHECK(w_cpu == w_opq);  // the working copy rounded from the loaded masters
  Recorder ra, rb;
  a.save(ra, layout, {w_cpu.data(), DType::bf16});
  b.save(rb, layout, {w_opq.data(), DType::bf16});
  REQUIRE(ra.puts.size() == rb.puts.size());
  CHECK(ra.puts == rb.puts);
}

TEST_CASE("an offloaded optimizer's host copy of its working slice is in the estimate") {
  const auto ps = params();
  const shard::FlatLayout layout(ps, 1, 64);
  const std::uint64_t n = layout.total();
  const OptimizerSettings settings{0.9, 0.95, 1e-8, 0.1};
  shard::OptimizerPlacement half;
  half.offload = Tier::host;
  half.offload_ratio = 0.5;
  const auto host_offload = [](const MemoryStats& m) {
    return m.current[Tier::host][Category::offload];
  };
  const auto estimated = [&](bool reaches) {
    return shard::ShardOptimizer::estimate(n, half, DType::bf16, DType::bf16, reaches)
        .bytes[Tier::host][Category::offload];
  };
  auto cpu = make_cpu_device(1);
  OpaqueDevice opaque;
  for (Device* d : {static_cast<Device*>(cpu.get()), static_cast<Device*>(&opaque)}) {
    Buffer w = d->allocate(Tier::device, Category::params, n * 2);
    const shard::ShardOptimizer opt(*d, ps, layout, 0, n, settings, half, DType::bf16,
                                    {w.data(), DType::bf16});
    const bool reaches = d->host_visible(Tier::device);
    CHECK(host_offload(d->stats()) == estimated(reaches));
  }
  CHECK(estimated(false) > 0);
  CHECK(estimated(true) == 0);
}

TEST_CASE("the step's norm stays with device gradients until its result is read") {
  const auto kernels = make_cpu_kernels();
  OpaqueDevice opaque;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const auto piece = [&](Tier tier, std::size_t n) {
    Buffer b = opaque.allocate(tier, Category::grads, n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) b.as<float>()[i] = nd(rng);  // RAM, whatever it claims
    return b;
  };
  const Buffer a = piece(Tier::device, 70001), b = piece(Tier::device, 777),
               b_host = piece(Tier::host, 777);
  std::memcpy(b_host.data(), b.data(), b.bytes());
  double sq = 0;
  for (const Buffer* x : {&a, &b})
    for (std::size_t i = 0; i < x->bytes() / 4; ++i)
      sq += static_cast<double>(x->as<float>()[i]) * x->as<float>()[i];
  StepArgs args;
  args.loss_scale = 4;
  args.grad_clip = 1;
  const double norm = std::sqrt(sq) / 4;
  const float mult = 0.25f * static_cast<float>(1.0 / norm);
  const auto span = [](const Buffer& x, Tier t) {
    return shard::GradSpan{{x.data(), DType::f32}, x.bytes() / 4, t};
  };

  int copies = opaque.copies;
  const shard::StepNorm on_device(opaque, {span(a, Tier::device), span(b, Tier::device)}, nullptr,
                                  *kernels, args);
  CHECK(opaque.copies == copies);  // nothing read back while the step is queued
  CHECK(on_device.on(Tier::device)->grad_mult == doctest::Approx(mult).epsilon(1e-6));
  const StepResult r = on_device.result();
  CHECK(opaque.copies == copies + 1);
  CHECK(r.grad_norm == doctest::Approx(norm).epsilon(1e-12));
  CHECK(!r.skipped);

  // A piece in host memory: the device's partial comes up, the scalars go
  // back down, and the sum is the same in the same order.
  copies = opaque.copies;
  const shard::StepNorm mixed(opaque, {span(a, Tier::device), span(b_host, Tier::host)}, nullptr,
                              *kernels, args);
  CHECK(opaque.copies == copies + 2);
  CHECK(mixed.result().grad_norm == r.grad_norm);
  CHECK(mixed.on(Tier::host)->grad_mult == on_device.on(Tier::device)->grad_mult);
  CHECK(mixed.on(Tier::device)->grad_mult == on_device.on(Tier::device)->grad_mult);

  b_host.as<float>()[5] = NAN;
  const shard::StepNorm overflow(opaque, {span(a, Tier::device), span(b_host, Tier::host)}, nullptr,
                                 *kernels, args);
  CHECK(overflow.result().skipped);
  CHECK(overflow.on(Tier::device)->skip == 1);  // the device's update skips too
}

TEST_CASE("an offloaded shard's working copy goes up in chunks, each waited for") {
  // Over 4M elements, so each step's upload is cut in two chunks (at 4M,
  // inside the first run), and a second run of another weight decay.
  ParamSpecs ps(2);
  ps[0_param].name = "w";
  ps[0_param].shape = {3, 1500001};
  ps[0_param].decay = true;
  ps[1_param].name = "b";
  ps[1_param].shape = {7};
  for (auto& p : ps) p.used_by = {0_module};
  const shard::FlatLayout layout(ps, 1, 16);
  const std::uint64_t n = layout.total();
  const OptimizerSettings settings{0.9, 0.95, 1e-8, 0.1};
  const auto kernels = make_cpu_kernels();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<std::uint16_t> w0(n), g(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    w0[i] = float_to_bf16(nd(rng));
    g[i] = float_to_bf16(nd(rng));
  }
  StepScalars scalars;
  scalars.grad_mult = 0.5f;
  const auto stepped = [&](Device& d) {
    Buffer w = d.allocate(Tier::device, Category::params, n * 2);
    std::memcpy(w.data(), w0.data(), n * 2);  // RAM, whatever the device claims
    shard::OptimizerShard opt(d, Tier::host, ps, layout, 0, n, settings, {w.data(), DType::bf16});
    std::vector<std::uint16_t> grads = g;
    for (int step = 1; step <= 2; ++step)
      opt.step({w.data(), DType::bf16}, {grads.data(), DType::bf16}, *kernels, 0.01, step, &scalars,
               GradAfter::kept);
    return std::vector<std::uint16_t>(w.as<std::uint16_t>(), w.as<std::uint16_t>() + n);
  };
  auto cpu = make_cpu_device(1);
  LaggingDevice lagging;
  const auto want = stepped(*cpu);
  CHECK(stepped(lagging) == want);  // padding between the runs included
  CHECK(lagging.started == 2 * 2);  // two steps of two chunks
  CHECK(want != w0);
}

TEST_CASE("reduced gradients land in a host shard by copies the reducer waits for") {
  const auto ps = params();
  const shard::FlatLayout layout(ps, 1);
  // Small buckets, so several land in one backward. One micro-step: its
  // copies are still pending at finish(). Two: the second adds to what the
  // first's copies wrote.
  for (int micro_steps : {1, 2}) {
    CAPTURE(micro_steps);
    auto comm = make_local_communicator();
    LaggingDevice lagging;
    std::vector<float> piece(layout.total(), -1.0f);
    const auto plan = shard::make_reduce_plan(
        ps, layout, shard::ReducePolicy::shard_during_backward, {5000, 5000, true});
    shard::GradReducer r(
        lagging, ps, layout, *comm, plan, DType::f32, {},
        std::vector<shard::GradPiece>{{0, layout.total(), piece.data(), Tier::host}}, "test");
    for (int micro = 0; micro < micro_steps; ++micro) {
      r.begin_micro_step(micro + 1 == micro_steps);
      for (ParamId p : ps.ids()) {
        TensorView g = r.grad(p);
        for (std::int64_t i = 0; i < g.numel(); ++i)
          g.f32()[i] = static_cast<float>(index_of(p) + 1 + static_cast<std::size_t>(micro));
      }
      r.module_done(0_module);
    }
    r.finish();
    CHECK(lagging.started > 1);
    for (ParamId p : ps.ids()) {
      // The sum over micro-steps of p + 1 + micro.
      const auto want =
          static_cast<float>(micro_steps * (index_of(p) + 1) + (micro_steps == 2 ? 1 : 0));
      const std::uint64_t at = layout.offset(p);
      CHECK(piece[at] == want);
      CHECK(piece[at + layout.numel(p) - 1] == want);
    }
  }
}

TEST_CASE("token ids are copied where the kernels read them only when the host cannot") {
  auto cpu = make_cpu_device(1);
  OpaqueDevice opaque;
  const std::vector<std::int32_t> tokens{5, 1, 4, 1, 5, 9, 2, 6};
  Arena direct(*cpu), staged(opaque);
  CHECK(direct.on_device(tokens.data(), tokens.size()) == tokens.data());
  const std::int32_t* d = staged.on_device(tokens.data(), tokens.size());
  CHECK(d != tokens.data());
  CHECK(std::vector<std::int32_t>(d, d + tokens.size()) == tokens);
}
