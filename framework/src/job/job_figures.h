// JobFigures: what the trainer reports for the whole job, combined over
// ranks by one all-gather: memory peaks are the largest of any rank (what a
// run needs per rank is its worst rank's, and ranks differ in who owns
// which parameters and receive buffers); bytes sent are summed over ranks;
// calls are this rank's (collectives: every rank makes the same ones).
#pragma once

#include <cstdint>

#include "ztrain/comm.h"
#include "ztrain/device.h"

namespace ztrain {

struct JobFigures {
  MemoryStats memory;  // peaks only
  CommCounters comm;   // bytes_sent summed over ranks
  int ranks = 1;
  // The mean over ranks of the bytes each sent.
  std::uint64_t bytes_per_rank() const {
    return comm.total_bytes() / static_cast<std::uint64_t>(ranks);
  }
};

// Collective over `comm`; the all-gather it issues is itself counted by
// comm after `traffic` was taken.
JobFigures gather_job_figures(Communicator& comm, const MemoryStats& memory,
                              const CommCounters& traffic);

}  // namespace ztrain
