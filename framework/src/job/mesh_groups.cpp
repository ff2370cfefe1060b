#include "job/mesh_groups.h"

#include "ztrain/error.h"

namespace ztrain {

// Every rank splits once per dimension, in the same order: a group's
// colour is its lowest rank (unique among the groups of a dimension), its
// members' keys their coordinates. A dimension of size 1 still gets its
// communicator of one rank, so consumers need no special case.
MeshGroups make_mesh_groups(const MeshPlan& plan, Communicator& world) {
  if (world.size() != plan.world())
    throw InternalError("make_mesh_groups: a plan of " + std::to_string(plan.world()) +
                        " ranks over a world of " + std::to_string(world.size()));
  MeshGroups groups;
  const int rank = world.rank();
  for (int i = 0; i < kMeshDims; ++i) {
    const auto d = static_cast<MeshDim>(i);
    groups.along_[i] = world.split(plan.group(rank, d).front(), plan.coordinate(rank, d));
  }
  // Another split (and, through shared memory, another segment) only where
  // a rank's parts are not the whole model.
  if (plan.size(MeshDim::tensor) > 1 || plan.size(MeshDim::pipeline) > 1)
    groups.same_part_ =
        world.split(plan.coordinate(rank, MeshDim::tensor) +
                        plan.size(MeshDim::tensor) * plan.coordinate(rank, MeshDim::pipeline),
                    rank);
  return groups;
}

}  // namespace ztrain
