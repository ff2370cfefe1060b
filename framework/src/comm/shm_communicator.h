// Collectives through shared memory for ranks that share a host. Part of
// the host.
//
// gloo moves every byte through TCP, which on one host costs two kernel
// copies per message and the CPU of gloo's event loop: 1.1-1.3 GB/s of
// all-reduce bus bandwidth at 2 ranks here, against 1.6-5.9 for Open MPI's
// shared-memory transport (bench/bench_comm). So a communicator whose ranks
// all see one memory runs its collectives through one segment they all map
// instead, and keeps the communicator it was made from for set-up and for
// split(). PyTorch's gloo group has no such path; DeepSpeed's CPU
// accelerator has one (its shm all-reduce).
//
// share_memory: rank 0 of `inner` creates a segment under /dev/shm holding
// a random nonce and broadcasts its name; every rank maps it and checks the
// nonce (a rank on another host finds no such file, or another nonce); all
// use it only when all agree, else `inner` is returned as it is. The name is
// unlinked once mapped (and registered as a TempFile until then), so nothing
// is left behind however the job ends.
//
// The communicator: collectives run in submission order on a worker thread
// (ThreadedCommunicator), in chunks through the segment, one barrier per
// chunk and phase; sums are taken in rank order by one rank per element, so
// every rank receives the same bits. Bytes are counted as a ring would send
// them, as for mpi and gloo. A peer that dies is found by the watchdog
// (through inner's heartbeat links) and ends the job, as for gloo.
//
// Thread safety: as any Communicator (one caller thread).
#pragma once

#include <memory>

#include "ztrain/comm.h"

namespace ztrain {

// Returns a communicator with inner's ranks that runs its collectives
// through shared memory when every rank of inner can map the segment rank 0
// made, or inner itself when one cannot (or inner has one rank). A
// collective call on inner (a broadcast and an all-reduce); every rank of
// inner must call it. inner is the world (its rank names this process in
// messages); its watchdog, where it has one (gloo), guards the new one too.
// timeout_s bounds every collective, as the backends' own.
std::unique_ptr<Communicator> share_memory(std::unique_ptr<Communicator> inner, double timeout_s);
// Whether comm is one that share_memory made.
bool shares_memory(const Communicator& comm);

}  // namespace ztrain
