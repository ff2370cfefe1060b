// The paths host code takes to memory it cannot touch (a GPU's), run on
// the CPU: a device whose device tier claims not to be host-visible (its
// memory is still RAM, so results can be compared) must give the same
// bits as the cpu device through every staged path, and must actually
// take those paths (its copies and conversions are counted).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/full_replica.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/optimizer_shard.h"

using namespace ztrain;

namespace {

// RAM that claims to be out of the host's reach; counts what goes through
// the device's movers.
class OpaqueDevice final : public Device {
 public:
  int copies = 0, converts = 0;
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "opaque"; }
  int threads() const override { return 1; }
  bool host_visible(Tier tier) const override { return tier != Tier::device; }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    ++copies;
    Device::copy(dst, src, bytes);
  }
  void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) override {
    ++converts;
    Device::convert(dst, src, n);
  }

 protected:
  void* raw_allocate(Tier, Category, std::size_t bytes, Fill fill) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (fill == Fill::zeros) std::memset(p, 0, bytes);
    return p;
  }
  void raw_free(Tier, Category, void* p, std::size_t) noexcept override { std::free(p); }
};

std::vector<ParamSpec> params() {
  std::vector<ParamSpec> out;
  for (auto [name, rows, cols] : {std::tuple{"a", 300, 70}, {"b", 1, 513}, {"c", 1000, 9}}) {
    ParamSpec p;
    p.name = name;
    p.shape = {rows, cols};
    p.init = {Init::Kind::normal, 0.5f};
    p.used_by = {0};
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
    std::vector<float> ra(static_cast<std::size_t>(layout.numel(1))), rb(ra.size());
    a.read(1, ra.data());
    b.read(1, rb.data());
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
