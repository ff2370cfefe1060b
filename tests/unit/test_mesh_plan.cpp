// The device mesh plan (job/mesh_plan.h): ranks' coordinates and groups
// along each dimension, over every factorisation of small worlds, and the
// refusals that name the [parallel] key.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "job/mesh_plan.h"
#include "support.h"

using namespace ztrain;

namespace {

constexpr MeshDim kDims[] = {MeshDim::tensor, MeshDim::sequence, MeshDim::context, MeshDim::data,
                             MeshDim::pipeline};

bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}

// The properties every plan has: along each dimension the groups partition
// the ranks into groups of its size, members differ in that coordinate
// only, and the coordinates name each rank once.
void check_plan(const MeshPlan& p) {
  std::set<std::array<int, kMeshDims>> places;
  for (int r = 0; r < p.world(); ++r) {
    std::array<int, kMeshDims> at{};
    for (int i = 0; i < kMeshDims; ++i) at[i] = p.coordinate(r, kDims[i]);
    places.insert(at);
    for (int i = 0; i < kMeshDims; ++i) {
      const auto g = p.group(r, kDims[i]);
      REQUIRE(static_cast<int>(g.size()) == p.size(kDims[i]));
      CHECK(std::count(g.begin(), g.end(), r) == 1);
      for (std::size_t k = 0; k < g.size(); ++k) {
        CHECK(p.coordinate(g[k], kDims[i]) == static_cast<int>(k));
        for (int j = 0; j < kMeshDims; ++j)
          if (j != i) CHECK(p.coordinate(g[k], kDims[j]) == at[j]);
      }
    }
  }
  CHECK(static_cast<int>(places.size()) == p.world());
}

}  // namespace

TEST_CASE("mesh: every factorisation of worlds up to 16 gives groups that partition the ranks") {
  int plans = 0;
  for (int world = 1; world <= 16; ++world)
    for (int t = 1; t <= world; ++t)
      for (int s = 1; s <= world; ++s)
        for (int c = 1; c <= world; ++c)
          for (int pp = 1; pp <= world; ++pp) {
            if (world % (t * s * c * pp) != 0) continue;
            CAPTURE(world);
            const MeshPlan p = plan_mesh({t, s, c, pp}, {{world}});
            CHECK(p.size(MeshDim::data) * t * s * c * pp == world);
            check_plan(p);
            ++plans;
          }
  CHECK(plans > 300);
}

TEST_CASE("mesh: tensor varies fastest and pipeline slowest, the description names each split") {
  // 16 ranks: tensor 2, sequence 2, data 2, pipeline 2.
  const MeshPlan p = plan_mesh({2, 2, 1, 2}, {{8, 8}});
  CHECK(p.size(MeshDim::data) == 2);
  CHECK(p.group(5, MeshDim::tensor) == std::vector<int>{4, 5});
  CHECK(p.group(5, MeshDim::sequence) == std::vector<int>{5, 7});
  CHECK(p.group(5, MeshDim::data) == std::vector<int>{1, 5});
  CHECK(p.group(5, MeshDim::pipeline) == std::vector<int>{5, 13});
  CHECK(p.group(5, MeshDim::context) == std::vector<int>{5});
  CHECK(p.coordinate(13, MeshDim::pipeline) == 1);
  CHECK(p.describe() == "tensor 2 x sequence 2 x data 2 x pipeline 2");
  CHECK(plan_mesh({}, {{4}}).describe() == "data 4");
  CHECK(plan_mesh({}, {{1}}).describe() == "data 1");
  // Groups as their ranks: consecutive runs, strided sets, long lists cut.
  CHECK(p.describe_groups(MeshDim::tensor) == "0-1 | 2-3 | 4-5 | 6-7 | ... (8 groups)");
  CHECK(p.describe_groups(MeshDim::sequence) == "0,2 | 1,3 | 4,6 | 5,7 | ... (8 groups)");
  const MeshPlan s2 = plan_mesh({1, 2, 1, 1}, {{4}});
  CHECK(s2.describe_groups(MeshDim::sequence) == "0-1 | 2-3");
  CHECK(s2.describe_groups(MeshDim::data) == "0,2 | 1,3");
  CHECK(plan_mesh({}, {{4}}).describe_groups(MeshDim::data) == "0-3");
  // With every degree 1 the data group is the world, as today.
  CHECK(plan_mesh({}, {{3, 3}}).group(4, MeshDim::data) == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("mesh: tensor and sequence groups stay inside a host, a context ring may span hosts") {
  // Hosts of 4: tensor x sequence groups of 4 fit; each is one host.
  const MeshPlan p = plan_mesh({2, 2, 1, 1}, {{4, 4}});
  for (int r = 0; r < 8; ++r)
    for (const MeshDim d : {MeshDim::tensor, MeshDim::sequence})
      for (const int q : p.group(r, d)) CHECK(q / 4 == r / 4);
  // A ring of 4 over hosts of 2 ranks.
  const MeshPlan ring = plan_mesh({1, 1, 4, 1}, {{2, 2}});
  CHECK(ring.group(0, MeshDim::context) == std::vector<int>{0, 1, 2, 3});
  // Uneven hosts whose counts are multiples still fit.
  check_plan(plan_mesh({2, 1, 1, 1}, {{2, 4, 2}}));
}

TEST_CASE("mesh: what does not fit is refused, naming [parallel] and the numbers") {
  const auto refused = [](ParallelSettings d, MeshHosts h) {
    return test::message_of<ConfigError>([&] { plan_mesh(d, h); });
  };
  CHECK(contains(refused({3, 1, 1, 1}, {{8}}),
                 "[parallel] tensor x sequence x context x pipeline = 3 x 1 x 1 x 1 does not "
                 "divide the job's 8 ranks"));
  CHECK(contains(refused({2, 2, 2, 2}, {{8}}), "2 x 2 x 2 x 2 does not divide the job's 8 ranks"));
  CHECK(contains(refused({0, 1, 1, 1}, {{8}}), "[parallel] tensor is 0; give 1"));
  CHECK(contains(refused({1, -2, 1, 1}, {{8}}), "[parallel] sequence is -2"));
  // Degrees whose product overflows 64 bits are refused, not wrapped.
  CHECK(contains(refused({1 << 30, 1 << 30, 1 << 30, 1 << 30}, {{8}}), "does not divide"));
  CHECK(contains(refused({4, 1, 1, 1}, {{6, 2}}),
                 "[parallel] tensor x sequence = 4 x 1 = 4 ranks must share a host, but host 0 "
                 "runs 6 ranks"));
  CHECK(contains(refused({1, 2, 1, 1}, {{3, 3}}), "host 0 runs 3 ranks"));
}
