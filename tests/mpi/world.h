// The world communicator of the multi-rank tests: MPI under mpirun, or gloo
// when ZTRAIN_TEST_BACKEND=gloo (ranks started by tests/mpi/run_ranks.sh
// with RANK/WORLD_SIZE), made on first use and kept for the process; with
// ZTRAIN_TEST_SHM=1, wrapped to run its collectives through shared memory
// (shm_communicator.h), as a run does by default.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "comm/shm_communicator.h"
#include "comm/world.h"
#include "ztrain/comm.h"

namespace ztrain::test {

inline bool gloo() {
  const char* b = std::getenv("ZTRAIN_TEST_BACKEND");
  return b && std::string(b) == "gloo";
}

inline bool shm() {
  const char* s = std::getenv("ZTRAIN_TEST_SHM");
  return s && std::string(s) == "1";
}

inline Communicator& world() {
  static const std::unique_ptr<Communicator> comm = [] {
    auto c = gloo() ? make_gloo_communicator(60.0) : make_mpi_communicator(60.0);
    return shm() ? share_memory(std::move(c), 60.0) : std::move(c);
  }();
  return *comm;
}

}  // namespace ztrain::test
