// Where a job's ranks run: each rank's host and the GPU its launcher gave
// it, gathered on every rank and said in one line of the run's header, so
// that a user who chose slots (`--include host:1`, a hostfile's slots)
// sees each rank on the slot asked for.
//
// A rank's GPU is the entry of CUDA_VISIBLE_DEVICES at its local rank (the
// device it opens is its local rank among the visible ones, as DeepSpeed's
// and torchrun's workers do), or its local rank when the variable is unset.
// A cpu run names the slots its launcher gave, which it does not use.
//
// Thread safety: collective (every rank calls it); the training thread.
#pragma once

#include <string>
#include <vector>

#include "job/mesh_plan.h"
#include "ztrain/comm.h"

namespace ztrain {

// One rank's place: its host, and its GPU slot ("" for none given).
struct RankPlace {
  std::string host;
  std::string gpu;
};

// This rank's place, from the environment its launcher set.
RankPlace this_rank_place(bool cuda);
// "ranks 0-1 on host a: GPU 1, 3 | rank 2 on host b: GPU 0": consecutive
// ranks on one host grouped; a cpu run's slots are said to be unused.
std::string placement_text(const std::vector<RankPlace>& ranks, bool cuda);
// Every rank's place, gathered (collective).
std::vector<RankPlace> gather_places(bool cuda, Communicator& comm);
// The hosts of the device mesh: each run of consecutive ranks on one host
// (ranks of a host that are not consecutive count as several hosts, so no
// group the mesh keeps inside a host ever leaves one).
MeshHosts mesh_hosts(const std::vector<RankPlace>& ranks);

}  // namespace ztrain
