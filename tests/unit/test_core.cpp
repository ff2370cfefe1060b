// Device memory accounting and budgets, units, the activation arena, the
// step context's checks and the world-1 communicator.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "support.h"
#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/error.h"
#include "ztrain/model.h"
#include "ztrain/units.h"

using namespace ztrain;

TEST_CASE("device accounts current and peak bytes per tier and category") {
  auto dev = make_cpu_device(1);
  {
    Buffer a = dev->allocate(Tier::device, Category::params, 1000);
    Buffer b = dev->allocate(Tier::host, Category::optimizer, 64);
    CHECK(a.as<float>()[0] == 0.0f);
    auto s = dev->stats();
    CHECK(s.current[Tier::device][Category::params] == 1000);
    CHECK(s.current[Tier::host][Category::optimizer] == 64);
    CHECK(s.tier_current[Tier::device] == 1000);
    Buffer moved = std::move(a);
    CHECK(dev->stats().tier_current[Tier::device] == 1000);
  }
  const auto s = dev->stats();
  CHECK(s.tier_current[Tier::device] == 0);
  CHECK(s.tier_peak[Tier::device] == 1000);
  CHECK(s.peak[Tier::host][Category::optimizer] == 64);
  dev->reset_peaks();
  CHECK(dev->stats().tier_peak[Tier::device] == 0);
  CHECK_FALSE(dev->allocate(Tier::device, Category::grads, 0));
}

TEST_CASE("large buffers: page-aligned, zero-filled, and at eight different 64 KiB colours") {
  // Arrays streamed together must not share their address bits above the
  // page (cpu_device.cpp): eight consecutive large blocks take the eight
  // values of address bits 16-18, whatever the allocator's alignment.
  auto dev = make_cpu_device(1);
  constexpr std::size_t kBytes = (std::size_t{4} << 20) + 12;
  std::vector<Buffer> blocks;
  std::set<std::uintptr_t> colours;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(dev->allocate(Tier::host, Category::optimizer, kBytes));
    const auto at = reinterpret_cast<std::uintptr_t>(blocks.back().data());
    CHECK(at % 4096 == 0);
    colours.insert(at / 65536 % 8);
    auto* bytes = static_cast<unsigned char*>(blocks.back().data());
    CHECK(bytes[0] == 0);
    CHECK(bytes[kBytes - 1] == 0);
    bytes[0] = bytes[kBytes - 1] = 0xff;
  }
  CHECK(colours.size() == 8);
  blocks.clear();
  CHECK(dev->stats().tier_current[Tier::host] == 0);
  CHECK(dev->stats().tier_peak[Tier::host] == 8 * kBytes);
  // Either side of the threshold, allocated and freed again and again (a
  // free through the wrong start aborts), each zero-filled though the one
  // before it was dirtied.
  for (std::size_t bytes : {(std::size_t{4} << 20) - 1, std::size_t{4} << 20}) {
    for (int i = 0; i < 3; ++i) {
      Buffer b = dev->allocate(Tier::host, Category::optimizer, bytes);
      auto* p = static_cast<unsigned char*>(b.data());
      CHECK(std::count(p, p + bytes, 0) == static_cast<std::ptrdiff_t>(bytes));
      std::memset(p, 0xab, bytes);
    }
  }
  CHECK_THROWS_AS(dev->allocate(Tier::host, Category::optimizer, SIZE_MAX - 4096),
                  OutOfMemoryError);
}

TEST_CASE("a budget makes allocation fail like a GPU: tier, category, request and peak named") {
  auto dev = make_cpu_device(1);
  dev->set_budget(Tier::device, 4096);
  Buffer a = dev->allocate(Tier::device, Category::params, 3000);
  const std::string msg = test::message_of<OutOfMemoryError>(
      [&] { dev->allocate(Tier::device, Category::activations, 2000); });
  CHECK(msg.find("tier 'device'") != std::string::npos);
  CHECK(msg.find("activations") != std::string::npos);
  CHECK(msg.find("1.95 KiB") != std::string::npos);  // request
  CHECK(msg.find("4.00 KiB budget") != std::string::npos);
  CHECK(msg.find("peak 2.93 KiB") != std::string::npos);
  CHECK(msg.find("memory_limit") != std::string::npos);    // what to do
  CHECK(dev->stats().tier_current[Tier::device] == 3000);  // failed request not counted
  Buffer host = dev->allocate(Tier::host, Category::offload, 1 << 20);  // other tiers unbudgeted
  CHECK(host);
}

TEST_CASE("sizes and durations as people write them") {
  CHECK(parse_size("2GiB") == 2147483648ull);
  CHECK(parse_size("512 KiB") == 524288);
  CHECK(parse_size("5e8") == 500000000);
  CHECK(parse_size("1.5GB") == 1500000000);
  CHECK(parse_size("100") == 100);
  CHECK_THROWS_AS(parse_size("2 parsecs"), ConfigError);
  CHECK_THROWS_AS(parse_size("-5"), ConfigError);
  CHECK(parse_duration("300s") == 300);
  CHECK(parse_duration("5m") == 300);
  CHECK(parse_duration("250ms") == doctest::Approx(0.25));
  CHECK(parse_duration("1h") == 3600);
  CHECK_THROWS_AS(parse_duration("soon"), ConfigError);
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(12) == "12 B");
}

TEST_CASE("the arena accounts what it hands out, within the budget, until reset") {
  auto dev = make_cpu_device(1);
  const auto activations = [&] {
    return dev->stats().current[Tier::device][Category::activations];
  };
  Arena arena(*dev);
  float* a = arena.alloc_f32(10);
  std::int32_t* b = arena.alloc_i32(100);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 64 == 0);
  CHECK(arena.used() == 64 + 448);  // 40 and 400 bytes in 64-byte multiples
  CHECK(activations() == 64 + 448);
  dev->set_budget(Tier::device, 1024);
  CHECK_THROWS_AS(arena.alloc_f32(200), OutOfMemoryError);
  arena.reset();
  CHECK(activations() == 0);
  CHECK(arena.used() == 0);
  CHECK(dev->stats().peak[Tier::device][Category::activations] == 64 + 448);
}

TEST_CASE("a rewound arena hands its allocations back as they were, its working ones shared") {
  auto dev = make_cpu_device(1);
  const auto activations = [&] {
    return dev->stats().current[Tier::device][Category::activations];
  };
  Arena working(*dev);
  Arena first(*dev, &working), second(*dev, &working);
  float* a = first.alloc_f32(10);
  float* host = first.alloc_host_f32(3);
  float* w = first.alloc_working_f32(16);
  a[9] = 7.0f;
  host[2] = 3.0f;
  CHECK(first.used() == 64);  // its working floats are the working arena's
  CHECK(working.used() == 64);
  second.reset();  // another micro-batch, as a model's call begins: the working arena afresh
  second.alloc_f32(100);
  CHECK(second.alloc_working_f32(16) != nullptr);
  CHECK(activations() == 64 + 448 + 64);

  first.rewind();  // backward: the same requests get the same memory
  CHECK(working.used() == 0);
  CHECK(first.alloc_f32(10) == a);
  float* host_again = first.alloc_host_f32(3);
  CHECK(host_again == host);
  CHECK(a[9] == 7.0f);
  CHECK(host_again[2] == 3.0f);
  CHECK(first.alloc_working_f32(16) != nullptr);
  CHECK(working.used() == 64);
  CHECK_THROWS_AS(first.alloc_f32(1), InternalError);  // past what forward asked for

  second.rewind();
  CHECK_THROWS_AS(second.alloc_f32(200), InternalError);  // not the size forward asked for
  second.rewind();
  CHECK_THROWS_AS(second.alloc_host_f32(100), InternalError);  // nor the tier
  second.reset();  // reset ends the replay: fresh allocations again
  CHECK(second.alloc_f32(1) != nullptr);
  CHECK(second.used() == 64);
  (void)w;
}

TEST_CASE("the step context refuses parameter views outside their modules") {
  Run run = test::make_run(
      "[model]\narch=\"gpt2\"\nn_layer=1\nn_head=2\nn_embd=8\nvocab_size=16\nseq_len=4\n"
      "[train]\nmicro_batch_size=1\n");
  const auto params = run.model->params();
  Arena arena(*run.device);
  LossSum losses(*run.device, *run.kernels);
  StepContext ctx(*run.strategy, params, *run.kernels, arena, losses, 1.0f);
  using namespace id_literals;
  CHECK_THROWS_AS(ctx.param(0_param), InternalError);
  ctx.enter_forward(0_module);
  CHECK(ctx.param(0_param).numel() == 16 * 8);         // wte inside embed
  CHECK_THROWS_AS(ctx.param(2_param), InternalError);  // block 0's ln_1 inside embed
  ctx.exit_forward(0_module);
  ctx.enter_backward(2_module);  // head uses the tied wte
  CHECK(ctx.grad(0_param).numel() == 16 * 8);
  ctx.exit_backward(2_module);
  CHECK_THROWS_AS(ctx.param(999_param), InternalError);
  // One past the last parameter, and an id a plugin made negative, are
  // not parameters (no view past the end of the specs).
  ctx.enter_forward(0_module);
  CHECK_THROWS_AS(ctx.param(params.end_id()), InternalError);
  CHECK_THROWS_AS(ctx.param(id_at<ParamId>(static_cast<std::size_t>(-1))), InternalError);
  ctx.exit_forward(0_module);
}

TEST_CASE("typed ids: a vector indexed by its own id, ranges, bounds and messages") {
  using namespace id_literals;
  IdVector<ParamId, std::string> names;
  CHECK(names.push_back("wte") == 0_param);
  CHECK(names.push_back("wpe") == 1_param);
  CHECK(names.end_id() == 2_param);
  CHECK(names[1_param] == "wpe");
  CHECK(names.contains(1_param));
  CHECK_FALSE(names.contains(2_param));  // one past the end
  CHECK_FALSE(names.contains(id_at<ParamId>(static_cast<std::size_t>(-1))));
  CHECK_THROWS_AS(names.at(2_param), std::out_of_range);
  std::vector<ParamId> seen;
  for (ParamId p : names.ids()) seen.push_back(p);
  CHECK(seen == std::vector<ParamId>{0_param, 1_param});
  CHECK(first_ids<ModuleId>(0).size() == 0);
  CHECK(next_id(3_module) == 4_module);
  CHECK(index_of(7_bucket) == 7);
  CHECK(to_string(12_group) == "12");
  // bool cells are std::vector<bool>'s, written through its reference.
  IdVector<GroupId, bool> live(3, false);
  live[1_group] = true;
  CHECK(live[1_group]);
  CHECK_FALSE(live[2_group]);
}

TEST_CASE("the world-1 communicator: exchanges copy, send nothing, and refuse another rank") {
  auto comm = make_local_communicator();
  const std::vector<float> send{1.5f, -2.0f, 3.25f};
  std::vector<float> recv(3, 0.0f);
  comm->all_to_all(send.data(), recv.data(), 3, DType::f32);
  CHECK(recv == send);
  std::vector<std::uint16_t> half{7, 9}, got(2, 0);
  comm->permute(half.data(), got.data(), 2, DType::bf16, Peers{0, 0});
  CHECK(got == half);
  const CommCounters c = comm->counters();
  CHECK(c.calls[static_cast<std::size_t>(Collective::all_to_all)] == 1);
  CHECK(c.calls[static_cast<std::size_t>(Collective::permute)] == 1);
  CHECK(c.total_bytes() == 0);
  CHECK_THROWS_WITH_AS(comm->permute(half.data(), got.data(), 2, DType::bf16, Peers{1, 0}),
                       doctest::Contains("both must be ranks of the group (0 to 0)"), CommError);
  CHECK(collective_name(Collective::all_to_all) == "all_to_all");
  CHECK(collective_name(Collective::permute) == "permute");
}
