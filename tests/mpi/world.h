// The world communicator of the multi-rank tests: MPI under mpirun, or gloo
// when ZTRAIN_TEST_BACKEND=gloo (ranks started by tests/mpi/run_ranks.sh
// with RANK/WORLD_SIZE), made on first use and kept for the process.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "comm/world.h"
#include "ztrain/comm.h"

namespace ztrain::test {

inline bool gloo() {
  const char* b = std::getenv("ZTRAIN_TEST_BACKEND");
  return b && std::string(b) == "gloo";
}

inline Communicator& world() {
  static const std::unique_ptr<Communicator> comm =
      gloo() ? make_gloo_communicator(60.0) : make_mpi_communicator(60.0);
  return *comm;
}

}  // namespace ztrain::test
