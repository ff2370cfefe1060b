// Fault points of the ranks' start-up: the StartKill of the run's fault
// plan (io/fault_plan.h, ZTRAIN_TEST_KILL_AT_START=PHASE[:RANK]) kills the
// process (SIGKILL) when it reaches PHASE, on every rank or on RANK only
// (the launcher's rank), so that tests can show how the other
// ranks end when one dies at each moment of the start. The phases, in the
// order a rank passes them:
//
//   store      gloo: rank 0 accepted this rank's store link (no heartbeat
//              link yet)
//   beats      gloo: its heartbeat link too (the meeting not over)
//   met        gloo: every rank arrived; gloo's address not yet published
//   published  gloo: this rank's gloo address is in the store, and half a
//              second has passed for the others to read it and start
//              connecting to this rank
//   mpi_init   mpi: MPI is initialised (no watchdog yet)
//   connected  either: the world communicator and its watchdog exist (the
//              run not yet sent by rank 0)
//
// Thread safety: plan_start_fault once, from main() before the ranks meet;
// start_fault_point from any thread after. Part of the host.
#pragma once

#include "io/fault_plan.h"

namespace ztrain {

// The start-up fault this process is to suffer (none until called).
void plan_start_fault(const StartKill& kill);

// Kills this process when the planned fault names `phase` for `rank`.
void start_fault_point(const char* phase, int rank);

}  // namespace ztrain
