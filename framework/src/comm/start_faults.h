// Test hook of the ranks' start-up: ZTRAIN_TEST_KILL_AT_START=PHASE[:RANK]
// kills the process (SIGKILL) when it reaches PHASE, on every rank or on
// RANK only (the launcher's rank), so that tests can show how the other
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
// Errors: ConfigError when the variable names no phase, at the first point
// passed. Thread safety: any thread. Part of the host.
#pragma once

namespace ztrain {

// Kills this process when the hook names `phase` for `rank`.
void start_fault_point(const char* phase, int rank);

}  // namespace ztrain
