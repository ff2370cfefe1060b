// The nccl backend: collectives between GPUs, one rank per GPU, through
// NCCL on the cuda device's communication stream.
//
// Ordering without host synchronisation: a collective first makes the
// communication stream wait for the work queued on the compute stream (so
// it reads what the kernels wrote), runs there, and records an event;
// CommWork::wait() makes the compute stream wait for that event. The host
// never blocks on the hot path; barrier() alone waits on the host.
// Irregular collectives (reduce_scatter_v, all_gather_v) are grouped calls
// of per-rank reduces and broadcasts.
//
// Host memory: NCCL moves GPU memory only, but strategies reduce a few
// scalars (a gradient norm's partial sums) and gather exported weights in
// host memory. A collective given a host buffer copies it to the GPU, runs,
// copies back and waits: correct, synchronous, and never on the hot path.
//
// Timeouts and failures: a watchdog thread polls the pending events and
// NCCL's asynchronous error. A collective unfinished after the timeout,
// or an NCCL error, prints "ztrain: rank R: OP of N DTYPE elements did not
// finish within T s on nccl; aborting NCCL and the job" (or NCCL's
// reason), calls ncclCommAbort and ends the process with status 3, which
// ends the job through its launcher.
//
// Counting: as mpi and gloo, the bytes a ring sends per collective,
// recorded when it is queued (it then completes or ends the job). The
// strategy's comm wait is about zero here: wait() does not block the
// host; the GPU's waits show in the step time.
// Ownership: the communicator borrows the device, which must outlive it.
// Thread safety: as Communicator.
#pragma once

#include <memory>

#include "cuda/cuda_device.h"
#include "ztrain/comm.h"

namespace ztrain::cuda {

// The ranks of `bootstrap` (an mpi or gloo communicator) as an NCCL
// communicator: rank 0's unique id reaches the others over bootstrap.
ZTRAIN_API std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                                Device& device, double timeout_s);

}  // namespace ztrain::cuda
