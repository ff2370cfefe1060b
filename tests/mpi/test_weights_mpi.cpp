// Initial weights only rank 0 can see, under mpirun and torchrun-style gloo
// at 2 and 4 ranks: rank 0 reads the ranges each other rank's strategy
// holds and sends them; every rank must then hold the file's values bit
// for bit (-0.0 and denormals included), under ddp, zero2 and zero3.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../unit/support.h"
#include "checkpoint/weights.h"
#include "checkpoint/weights_import.h"
#include "world.h"

using namespace ztrain;
using test::world;

namespace {

// A run of `strategy` on a communicator of its own over every rank.
Run make_run(const std::string& strategy) {
  const RunConfig config = RunConfig::parse(
      "[model]\narch = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 8\nvocab_size = 11\n"
      "seq_len = 5\n[strategy]\nplugin = \"" +
          strategy + "\"\n[train]\nseed = 1\nmicro_batch_size = 1\n",
      "test.toml");
  return assemble(world().split(0, world().rank()), config, test::loader());
}

// The values written to the file: the run's own, with awkward ones mixed in.
std::vector<std::vector<float>> awkward(const Model& model) {
  std::vector<std::vector<float>> values;
  std::uint64_t k = 0;
  for (const ParamSpec& p : model.params()) {
    auto& v = values.emplace_back(static_cast<std::size_t>(p.shape.numel()));
    for (float& x : v) {
      const std::uint64_t i = k++;
      x = i % 5 == 0   ? -0.0f
          : i % 7 == 0 ? std::numeric_limits<float>::denorm_min()
                       : static_cast<float>(i % 13) * 0.25f - 1.5f;
    }
  }
  return values;
}

}  // namespace

TEST_CASE("weights only rank 0 sees reach every rank bit for bit, whatever its strategy holds") {
  REQUIRE(world().size() >= 2);
  for (const char* strategy : {"ddp", "zero2", "zero3"}) {
    INFO(strategy << " at world " << world().size());
    Run run = make_run(strategy);
    const auto want = awkward(*run.model);
    test::TempDir dir;
    const auto path = dir / "init.safetensors";
    if (run.comm->rank() == 0)
      write_weights(*run.model, run.model->params(), path, DType::f32, [&](ParamId p, float* out) {
        const auto& v = want[static_cast<std::size_t>(p)];
        std::memcpy(out, v.data(), v.size() * sizeof(float));
      });
    // The other ranks name a file their host does not have.
    const WeightsImport w = import_weights(
        *run.model, *run.strategy, run.comm->rank() == 0 ? path : dir / "absent", *run.comm);
    CHECK(w.from_rank_0);
    CHECK(w.bytes_moved > 0);
    std::vector<float> got;
    for (std::size_t i = 0; i < want.size(); ++i) {
      got.assign(want[i].size(), 1.0f);
      run.strategy->read_param(static_cast<ParamId>(i), got.data());
      CHECK(std::memcmp(got.data(), want[i].data(), got.size() * sizeof(float)) == 0);
    }
  }
}
