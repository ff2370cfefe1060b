// The device mesh: how a job's ranks split into groups along each parallel
// dimension, as a pure plan (read by the run, which makes one
// sub-communicator per group, and by `estimate`), checked before anything
// is built.
//
// Dimensions, innermost (consecutive ranks) first: tensor, sequence
// (Ulysses), context (ring), data, pipeline. A rank's coordinates are the
// digits of its number in that mixed radix:
//
//   rank = (((pipeline * D + data) * C + context) * S + sequence) * T + tensor
//
// so the chattiest groups (tensor's all-reduces, Ulysses' all-to-alls) are
// runs of consecutive ranks, which launchers place on one host, and the
// pipeline's point-to-point sends cross the widest distance. The data
// degree is what the others leave of the world: [strategy] shards across
// the data group exactly as it shards across the world today. Tensor and
// sequence groups must stay inside a host (their traffic is too heavy for
// the network between hosts); a context ring may span hosts.
//
// Errors: ConfigError naming the [parallel] key and the numbers that do
// not fit (degrees that do not divide the world, or a host's ranks).
// Thread safety: a value; read it from any thread.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "config/run_settings.h"

namespace ztrain {

enum class MeshDim { tensor, sequence, context, data, pipeline };
inline constexpr int kMeshDims = 5;

// The hosts of a job: how many ranks each runs, ranks numbered host after
// host (as every launcher of ztrain numbers them).
struct MeshHosts {
  std::vector<int> ranks;
};

class MeshPlan {
 public:
  int world() const { return world_; }
  int size(MeshDim d) const { return size_[static_cast<int>(d)]; }
  // Rank's place along d: 0 to size(d) - 1.
  int coordinate(int rank, MeshDim d) const;
  // The ranks of rank's group along d (those that differ from it in d
  // only), ordered by their coordinate in d.
  std::vector<int> group(int rank, MeshDim d) const;
  // "data 2 x tensor 2 x pipeline 2", the dimensions above 1 (or "data 1").
  std::string describe() const;
  // The groups along d, each as its ranks ("0-1 | 2-3", "0,2 | 1,3"): the
  // first four, then "| ... (N groups)".
  std::string describe_groups(MeshDim d) const;

 private:
  friend MeshPlan plan_mesh(const ParallelSettings& degrees, const MeshHosts& hosts);
  int world_ = 1;
  std::array<int, kMeshDims> size_{1, 1, 1, 1, 1};
  std::array<int, kMeshDims> stride_{1, 1, 1, 1, 1};
};

// The mesh of [parallel]'s degrees over `hosts` (the data degree is what
// they leave of the world; expert is not a dimension of it yet); refuses
// what does not fit.
MeshPlan plan_mesh(const ParallelSettings& degrees, const MeshHosts& hosts);

}  // namespace ztrain
