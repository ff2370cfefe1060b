// FaultPlan: the faults a test asks a run to suffer, read once from the
// environment when the run starts and handed to what they break, so no
// production path reads the environment itself.
//
//   ZTRAIN_TEST_INJECT_OVERFLOW=STEP:RANK   rank RANK's gradients are NaN in
//                                          step STEP (1-based), as an fp16
//                                          overflow would make them
//   ZTRAIN_TEST_SCALE_LR=STEP              step STEP trains with 1.1 times
//                                          its learning rate (a run that
//                                          differs from its peers)
//   ZTRAIN_TEST_KILL_IN_CHECKPOINT=STEP:K[:RANK]
//                                          the checkpoint of step STEP is
//                                          killed (SIGKILL) at its K-th
//                                          crash point, on every rank or RANK
//   ZTRAIN_TEST_KILL_AT_START=PHASE[:RANK] the process is killed when it
//                                          reaches PHASE of the ranks'
//                                          start-up (comm/start_faults.h)
//   ZTRAIN_TEST_INJECT_WRITE_ERROR=ENOSPC|EIO
//                                          every durable file write fails
//                                          (io/durable_file.h)
//   ZTRAIN_TEST_INJECT_IO_ERROR=ENOSPC:N|EIO:N
//                                          the N-th write of the NVMe tier
//                                          fails (shard/aio_fault.h)
//   ZTRAIN_TEST_FAIL=WHERE:KIND:STEP[:RANK]
//                                          step STEP throws on every rank
//                                          or RANK when it reaches WHERE
//                                          (forward, backward, reduce,
//                                          gather, optimizer, checkpoint):
//                                          KIND oom an out-of-memory error,
//                                          error any other
//                                          (train/failure_points.h)
//   ZTRAIN_TEST_HOLD=POINT:SECONDS[,POINT:SECONDS...]
//                                          the process holds SECONDS at each
//                                          POINT of a hand-off (lock_release,
//                                          checkpoint_located, ...: see
//                                          core/hold_points.h), so a test can
//                                          start the competing process there
//   ZTRAIN_TEST_COMPARE_PERTURB=STRATEGY:STEP
//                                          `ztrain compare` runs STRATEGY's
//                                          job with ZTRAIN_TEST_SCALE_LR=STEP
//
// main() reads the plan once and hands each part its fault; nothing else
// reads these variables.
//
// Errors: from_environment raises ConfigError naming a variable whose value
// does not parse. Thread safety: a value; read it from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ztrain {

// The checkpoint write to kill: the one of `step`, at crash point `point`.
struct CheckpointKill {
  std::int64_t step = 0;  // 0: none
  long long point = 0;
  int rank = -1;  // -1: every rank
  bool applies(std::int64_t at_step, int at_rank) const {
    return step > 0 && step == at_step && (rank < 0 || rank == at_rank);
  }
};

// The start-up phase to die at (comm/start_faults.h): empty for none.
struct StartKill {
  std::string phase;
  int rank = -1;  // -1: every rank
};

// The failure to throw (train/failure_points.h): where, what, when.
struct InjectedFailure {
  std::string where;  // empty: none
  bool out_of_memory = false;
  std::int64_t step = 0;  // 1-based
  int rank = -1;          // -1: every rank
  bool applies(std::int64_t at_step, int at_rank) const {
    return !where.empty() && step == at_step && (rank < 0 || rank == at_rank);
  }
};

struct FaultPlan {
  std::int64_t overflow_step = 0;  // 0: none
  int overflow_rank = -1;
  std::int64_t scale_lr_step = 0;  // 0: none
  CheckpointKill checkpoint_kill;
  StartKill start_kill;
  int write_error = 0;  // errno every durable write fails with; 0: none
  int nvme_error = 0;   // errno the NVMe tier's write number nvme_error_after fails with
  long nvme_error_after = 0;
  std::string compare_perturb;  // STRATEGY:STEP, empty: none
  InjectedFailure failure;
  std::map<std::string, double> holds;  // seconds per hold point

  static FaultPlan from_environment();
  // Whether rank `rank`'s gradients are made NaN in step `step` (1-based).
  bool overflows(std::int64_t step, int rank) const {
    return overflow_step > 0 && overflow_step == step && overflow_rank == rank;
  }
  // The learning-rate factor of step `step` (1-based).
  double lr_factor(std::int64_t step) const {
    return scale_lr_step > 0 && step == scale_lr_step ? 1.1 : 1.0;
  }
};

}  // namespace ztrain
