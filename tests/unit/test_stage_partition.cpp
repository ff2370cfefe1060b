// Modules into pipeline stages (ztrain/pipeline/stage_partition.h):
// uniform as DeepSpeed's partition_uniform cuts, parameters against a brute
// force over every cut, module weights counting a tied parameter in both
// modules, and the refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "support.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/stage_partition.h"
#include "ztrain/random.h"

using namespace ztrain;
using namespace ztrain::pipeline;
using ztrain::test::message_of;

namespace {

std::uint64_t heaviest(const std::vector<std::uint64_t>& w, const std::vector<std::size_t>& b) {
  std::uint64_t most = 0;
  for (std::size_t p = 0; p + 1 < b.size(); ++p)
    most = std::max(
        most, std::accumulate(w.begin() + static_cast<std::ptrdiff_t>(b[p]),
                              w.begin() + static_cast<std::ptrdiff_t>(b[p + 1]), std::uint64_t{0}));
  return most;
}

// The least heaviest part over every cut of w into `parts` non-empty parts.
std::uint64_t brute_force(const std::vector<std::uint64_t>& w, std::size_t parts,
                          std::vector<std::size_t> bounds = {0}) {
  if (bounds.size() == parts) {
    bounds.push_back(w.size());
    return heaviest(w, bounds);
  }
  std::uint64_t best = ~std::uint64_t{0};
  const std::size_t left = parts - bounds.size();  // parts after the one now cut
  for (std::size_t end = bounds.back() + 1; end + left <= w.size(); ++end) {
    auto next = bounds;
    next.push_back(end);
    best = std::min(best, brute_force(w, parts, next));
  }
  return best;
}

void check_well_formed(const std::vector<std::size_t>& b, std::size_t n, std::size_t parts) {
  REQUIRE(b.size() == parts + 1);
  CHECK(b.front() == 0);
  CHECK(b.back() == n);
  for (std::size_t p = 0; p < parts; ++p) CHECK(b[p] < b[p + 1]);
}

}  // namespace

TEST_CASE("uniform cuts as DeepSpeed's partition_uniform: the first stages one more") {
  const std::vector<std::uint64_t> fourteen(14, 1);  // GPT-2 124M: embedding, 12 blocks, head
  CHECK(partition_modules(fourteen, 4, PartitionMethod::uniform) ==
        std::vector<std::size_t>{0, 4, 8, 11, 14});
  CHECK(partition_modules(fourteen, 2, PartitionMethod::uniform) ==
        std::vector<std::size_t>{0, 7, 14});
  CHECK(partition_modules(fourteen, 14, PartitionMethod::uniform).back() == 14);
}

TEST_CASE("parameters makes the heaviest stage as light as every cut could") {
  std::uint64_t state = 7;
  const auto next = [&state] { return splitmix64(state++); };
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + next() % 9, parts = 1 + next() % n;
    std::vector<std::uint64_t> w(n);
    for (auto& x : w) x = next() % (trial % 3 == 0 ? 4 : 1000);  // ties, zeros too
    CAPTURE(n);
    CAPTURE(parts);
    const auto b = partition_modules(w, parts, PartitionMethod::parameters);
    check_well_formed(b, n, parts);
    CHECK(heaviest(w, b) == brute_force(w, parts));
  }
}

TEST_CASE("parameters balances a GPT-2 whose tied embedding weighs in the first and last stage") {
  // GPT-2 124M's modules: the embedding (wte 50257 x 768 + wpe 1024 x 768),
  // twelve blocks of 7,087,872, the head (the tied wte and the final norm).
  ParamSpecs params;
  const auto add = [&params](std::string name, Shape shape, std::vector<std::size_t> modules) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    for (const std::size_t m : modules) p.used_by.push_back(id_at<ModuleId>(m));
    params.push_back(std::move(p));
  };
  add("wte.weight", Shape{50257, 768}, {0, 13});
  add("wpe.weight", Shape{1024, 768}, {0});
  for (std::size_t l = 0; l < 12; ++l) add("h." + std::to_string(l), Shape{7087872}, {l + 1});
  add("ln_f.weight", Shape{768}, {13});
  const auto w = module_weights(params, 14);
  CHECK(w[0] == 50257ull * 768 + 1024ull * 768);
  CHECK(w[13] == 50257ull * 768 + 768);
  CHECK(w[5] == 7087872);
  const auto b = partition_modules(w, 2, PartitionMethod::parameters);
  CHECK(b == std::vector<std::size_t>{0, 7, 14});
  CHECK(heaviest(w, b) == brute_force(w, 2));
  CHECK(heaviest(w, partition_modules(w, 4, PartitionMethod::parameters)) == brute_force(w, 4));
}

TEST_CASE("fewer modules than stages, and an unknown method, are refused by name") {
  const std::string m = message_of<ConfigError>(
      [] { partition_modules(std::vector<std::uint64_t>(3, 1), 4, PartitionMethod::uniform); });
  CHECK(m.find("4 (virtual) stages but the model 3 modules") != std::string::npos);
  CHECK(partition_method("parameters") == PartitionMethod::parameters);
  CHECK(message_of<ConfigError>([] {
          partition_method("type:transformer");
        }).find("choose \"uniform\"") != std::string::npos);
}

TEST_CASE("a stage's chunks are every P-th virtual stage, and a tied parameter's stages both") {
  // 8 modules into 2 stages x 2 chunks: virtual stages [0,2) [2,4) [4,6) [6,8).
  const std::vector<std::size_t> bounds{0, 2, 4, 6, 8};
  CHECK(stage_chunks(bounds, 2, 0) == std::vector<ModuleRange>{{0, 2}, {4, 6}});
  CHECK(stage_chunks(bounds, 2, 1) == std::vector<ModuleRange>{{2, 4}, {6, 8}});
  CHECK(stage_chunks(bounds, 4, 3) == std::vector<ModuleRange>{{6, 8}});
  CHECK_THROWS_AS(stage_chunks(bounds, 3, 0), InternalError);  // 4 virtual stages, 3 stages
  CHECK_THROWS_AS(stage_chunks(bounds, 2, 2), InternalError);
  ParamSpec tied;
  tied.used_by = {id_at<ModuleId>(0), id_at<ModuleId>(7)};
  CHECK(stages_holding(tied, bounds, 2) == std::vector<std::size_t>{0, 1});
  CHECK(stages_holding(tied, bounds, 4) == std::vector<std::size_t>{0, 3});
  ParamSpec block;
  block.used_by = {id_at<ModuleId>(5)};
  CHECK(stages_holding(block, bounds, 2) == std::vector<std::size_t>{0});
  CHECK(stages_holding(block, bounds, 4) == std::vector<std::size_t>{2});
}
