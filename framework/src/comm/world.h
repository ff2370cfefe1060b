// The world communicators the host makes for a job, and what the launcher
// that started this process says about it. Part of the host: a plugin is
// handed its communicator (StrategySetup) and never makes one; the SDK's
// own is make_local_communicator (ztrain/comm.h), for a world of one.
//
// Thread safety: the launcher queries read the environment and may be
// called from any thread; make the world once, from the main thread.
#pragma once

#include <memory>

#include "ztrain/comm.h"

namespace ztrain {

// The MPI world (MPI is initialised on first use, finalised at exit).
// timeout_s bounds every collective. Raises CommError when MPI cannot start.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s);

// True when this process was started by an MPI launcher (mpirun, srun with
// PMI/PMIx): the `auto` backend then uses MPI.
bool launched_by_mpi();
// The world of a torchrun-style launch: every rank started on its own with
// RANK and WORLD_SIZE, meeting at rank 0's rendezvous store on
// MASTER_ADDR:MASTER_PORT; gloo's TCP transport then runs the collectives.
// Raises CommError naming what is missing or who did not arrive within
// timeout_s.
std::unique_ptr<Communicator> make_gloo_communicator(double timeout_s);
// True when RANK and WORLD_SIZE > 1 are set (the `auto` backend then uses
// gloo unless an MPI launcher started the process).
bool launched_by_env();
// This process's rank as its launcher numbered it (OMPI_COMM_WORLD_RANK,
// PMI_RANK, PMIX_RANK, or RANK); 0 when no launcher started it.
int launcher_rank();
// Ranks the launcher placed on this machine (1 when not launched by one), so
// each rank can take its share of the cores.
int local_rank_count();
// This rank's place among them, as the launcher that started it numbers it
// (MPI: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, PMIX_LOCAL_RANK or
// SLURM_LOCALID; torchrun-style: LOCAL_RANK; 0 without a launcher): which
// GPU it takes.
int local_rank();

}  // namespace ztrain
