// Tensor-parallel parts (ztrain/model.h's TensorSplit): each element of a
// part maps to the whole parameter's element a reference cut by hand
// holds there, rows or columns, in sections; a part's initial values are
// those elements' (shard/init.h); and the flat runs of parameters a tensor
// group shares whole are what the gradient norm skips on all but one rank
// (shard/optimizer_shard.h's shared_runs), as is a pipeline stage's tied
// copy of a parameter another stage holds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/shard/flat_layout.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/optimizer_shard.h"

using namespace ztrain;

namespace {

// The whole (rows x cols) matrix's flat indices that part `part` of
// `parts` holds, cut along dim in `sections`, in the part's row-major
// order: the reference, built as Megatron cuts a fused projection.
std::vector<std::uint64_t> cut_by_hand(std::uint64_t rows, std::uint64_t cols, int dim, int parts,
                                       int part, int sections) {
  std::vector<std::uint64_t> out;
  if (dim == 0) {
    const std::uint64_t each = rows / sections / parts;
    for (int s = 0; s < sections; ++s)
      for (std::uint64_t r = 0; r < each; ++r) {
        const std::uint64_t whole_row = (s * parts + part) * each + r;
        for (std::uint64_t c = 0; c < cols; ++c) out.push_back(whole_row * cols + c);
      }
    return out;
  }
  const std::uint64_t each = cols / sections / parts;
  for (std::uint64_t r = 0; r < rows; ++r)
    for (int s = 0; s < sections; ++s)
      for (std::uint64_t c = 0; c < each; ++c)
        out.push_back(r * cols + (s * parts + part) * each + c);
  return out;
}

}  // namespace

TEST_CASE("a part's elements are the whole's that a cut by hand gives it") {
  const std::uint64_t rows = 18, cols = 36;
  for (int dim : {0, 1})
    for (int parts : {1, 2, 3})
      for (int sections : {1, 3})
        for (int part = 0; part < parts; ++part) {
          CAPTURE(dim);
          CAPTURE(parts);
          CAPTURE(sections);
          CAPTURE(part);
          const TensorSplit split{dim, parts, part, sections};
          const Shape local = dim == 0 ? Shape{std::int64_t(rows / parts), std::int64_t(cols)}
                                       : Shape{std::int64_t(rows), std::int64_t(cols / parts)};
          const auto want = cut_by_hand(rows, cols, dim, parts, part, sections);
          REQUIRE(want.size() == static_cast<std::size_t>(local.numel()));
          for (std::uint64_t i = 0; i < want.size(); ++i)
            CHECK(split.whole_index(local, i) == want[i]);
          // Each run is the longest stretch of consecutive whole indices
          // from its element on: it ends where the next index jumps.
          for (std::uint64_t i = 0; i < want.size(); ++i) {
            const std::uint64_t n = split.run_length(local, i);
            REQUIRE(n >= 1);
            REQUIRE(i + n <= want.size());
            for (std::uint64_t k = 1; k < n; ++k) CHECK(want[i + k] == want[i] + k);
            if (i + n < want.size()) CHECK(want[i + n] != want[i] + n);
          }
        }
  // A vector cut by rows: GPT-2's fused q, k, v bias.
  const TensorSplit bias{0, 2, 1, 3};
  CHECK(bias.whole_index(Shape{6}, 0) == 2);
  CHECK(bias.whole_index(Shape{6}, 2) == 6);
  CHECK(bias.whole_index(Shape{6}, 5) == 11);
}

// A vocabulary the degree does not divide: 11 rows over 3 parts hold 3, 4
// and 4 rows, the parts together every row once, in order; whole_numel
// and the extent name the whole.
TEST_CASE("parts of unequal rows cover the whole once, in order") {
  const std::int64_t rows = 11, cols = 5;
  std::vector<std::uint64_t> seen;
  std::vector<std::int64_t> sizes;
  for (int part = 0; part < 3; ++part) {
    const TensorSplit split{0, 3, part, 1, 1, rows};
    const std::int64_t mine = split.first_row(part + 1) - split.first_row(part);
    sizes.push_back(mine);
    const Shape local{mine, cols};
    for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(local.numel()); ++i)
      seen.push_back(split.whole_index(local, i));
    ParamSpec p;
    p.shape = local;
    p.split = split;
    CHECK(whole_numel(p) == rows * cols);
    CHECK(split.whole_extent(mine) == rows);
  }
  CHECK(sizes == std::vector<std::int64_t>{3, 4, 4});
  REQUIRE(seen.size() == static_cast<std::size_t>(rows * cols));
  for (std::uint64_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);
}

TEST_CASE("a part starts at the values the whole parameter has there") {
  ParamSpec whole;
  whole.name = "w";
  whole.shape = Shape{6, 4};
  whole.init = {Init::Kind::normal, 0.02f};
  std::vector<float> all(24);
  shard::initial_values(whole, 3, 11, 0, 24, all.data());
  for (int part = 0; part < 2; ++part) {
    ParamSpec p = whole;
    p.shape = Shape{6, 2};
    p.split = {1, 2, part, 1};
    std::vector<float> mine(12);
    shard::initial_values(p, 3, 11, 0, 12, mine.data());
    for (std::uint64_t i = 0; i < 12; ++i) CHECK(mine[i] == all[p.split.whole_index(p.shape, i)]);
  }
}

TEST_CASE("the flat runs of shared parameters, in a split model and in a whole one") {
  using shard::SharedRun;
  ParamSpecs params;
  const auto add = [&](const char* name, std::int64_t n, TensorSplit split) {
    ParamSpec p;
    p.name = name;
    p.shape = Shape{n};
    p.split = split;
    params.push_back(p);
  };
  add("norm", 16, {});
  add("fc", 32, {0, 4, 1, 1});
  add("bias", 16, {});
  add("ln", 16, {});
  add("k", 16, {0, 2, 0, 1, 2});  // a key/value head two ranks of four hold
  const shard::FlatLayout layout(params, 1);
  CHECK(shard::shared_runs(params, layout, 0, layout.total()) ==
        std::vector<SharedRun>{{0, 16, 0}, {48, 80, 0}, {80, 96, 2}});
  CHECK(shard::shared_runs(params, layout, 20, 60) == std::vector<SharedRun>{{28, 40, 0}});
  ParamSpecs whole_model;
  whole_model.push_back(params[ParamId{}]);
  CHECK(shard::shared_runs(whole_model, shard::FlatLayout(whole_model, 1), 0, 16).empty());
}

TEST_CASE("a pipeline stage's tied copy is left out of its norm, counted on the other stage") {
  using shard::SharedRun;
  ParamSpecs params;  // the last stage of a tied GPT-2: a block, then its copy of wte
  for (const char* name : {"h.1", "wte"}) {
    ParamSpec p;
    p.name = name;
    p.shape = Shape{8};
    params.push_back(p);
  }
  params[id_at<ParamId>(1)].tied_copy = true;
  const shard::FlatLayout layout(params, 1);
  const std::uint64_t copy = layout.offset(id_at<ParamId>(1)), n = layout.total();
  const std::vector<SharedRun> runs = shard::shared_runs(params, layout, 0, n);
  CHECK(runs == std::vector<SharedRun>{{copy, copy + 8, SharedRun::kCountedElsewhere}});
  // The norm of the block's 8 threes alone, not of the copy's fours too.
  auto dev = make_cpu_device(1);
  const auto kernels = make_cpu_kernels();
  std::vector<float> g(n, 0.0f);
  std::fill(g.begin(), g.begin() + 8, 3.0f);
  std::fill(g.begin() + static_cast<std::ptrdiff_t>(copy),
            g.begin() + static_cast<std::ptrdiff_t>(copy + 8), 4.0f);
  const shard::StepNorm norm(*dev, {{{g.data(), DType::f32}, n, Tier::device, runs}}, nullptr,
                             *kernels, StepArgs{});
  CHECK(norm.result().grad_norm == doctest::Approx(std::sqrt(8.0 * 9.0)));
}
