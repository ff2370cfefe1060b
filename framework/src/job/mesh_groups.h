// A rank's communicators on the device mesh: one per dimension (tensor,
// sequence, context, data, pipeline), each holding the ranks of its group
// in the mesh plan (job/mesh_plan.h), ordered by their coordinate along
// that dimension, so a group's rank r is the member at coordinate r.
// They are splits of the world communicator, on whatever backend it runs
// (MPI, gloo, shared memory, NCCL), and count into its counters.
//
// Ownership: MeshGroups owns its communicators; they must not outlive the
// world they were split from. Errors: CommError from the splits.
// Thread safety: make_mesh_groups is collective over the world (every rank
// calls it with the same plan); the communicators as any Communicator.
#pragma once

#include <array>
#include <memory>

#include "job/mesh_plan.h"
#include "ztrain/comm.h"

namespace ztrain {

class MeshGroups {
 public:
  Communicator& operator[](MeshDim d) const { return *along_[static_cast<int>(d)]; }
  // The ranks holding the same parts of the model as this one (every
  // dimension but tensor and pipeline): whom a strategy shards and
  // averages over. Made only where the tensor or pipeline degree is above
  // 1.
  Communicator& same_part() const { return *same_part_; }

 private:
  friend MeshGroups make_mesh_groups(const MeshPlan& plan, Communicator& world);
  std::array<std::unique_ptr<Communicator>, kMeshDims> along_;
  std::unique_ptr<Communicator> same_part_;
};

// Splits `world` (whose size is plan.world()) into this rank's groups.
MeshGroups make_mesh_groups(const MeshPlan& plan, Communicator& world);

}  // namespace ztrain
