// CheckpointsInFlight: the training loop's checkpoints. One is written at
// a time, mostly while training goes on (checkpoint/writer.h), and
// committed at the first step after every rank's write is done (which the
// ranks learn through their step agreement, train/step_agreement.h); the
// host copies and the pruner are kept for the next ones.
//
// Errors: IoError and DataError from the writes (a full disk names it).
// Thread safety: the training thread.
#pragma once

#include <cstdint>
#include <optional>

#include "checkpoint/manifest.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/writer.h"
#include "io/fault_plan.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/run_assembly.h"

namespace ztrain {

class CheckpointsInFlight {
 public:
  // `kill`: a test's kill of one checkpoint write (io/fault_plan.h).
  CheckpointsInFlight(Run& run, const CheckpointKill& kill, MetricsFile* metrics,
                      Progress& progress)
      : run_(run), kill_(kill), metrics_(metrics), progress_(progress), buffers_(*run.device) {}
  // This rank's part is written (or none is in flight): its flag in the
  // step agreement.
  bool rank_done() const { return !pending_ || pending_->rank_done(); }
  // After a step: commits what every rank has written; when `due`, starts
  // the checkpoint of `at`, committed at once when it is the last (`last`:
  // no training left to overlap) or was written within the step.
  void after_step(const TrainingPosition& at, bool written_everywhere, bool due, bool last) {
    if (written_everywhere) commit(true);
    if (!due) return;
    commit(true);
    begin(at);
    if (last || pending_->written_in_step()) commit(false);
  }
  // The ranks agreed to stop after the step `at`: the checkpoint being
  // written, if any, is finished and is the one the run stops at (a signal
  // during a large write must not cost a second one); else one of `at` is
  // written. Returns the step of the checkpoint the run stops at.
  std::int64_t stop(const TrainingPosition& at) {
    if (pending_) {
      commit(true);
      return step_;
    }
    after_step(at, false, true, true);
    return at.step;
  }

 private:
  // Starts the checkpoint of `at` in pending_.
  void begin(const TrainingPosition& at);
  // Commits pending_, whose files are written, and says so; `overlapped`:
  // training went on while it was written.
  void commit(bool overlapped);

  Run& run_;
  CheckpointKill kill_;
  MetricsFile* metrics_;
  Progress& progress_;
  SnapshotBuffers buffers_;  // these two outlive pending_
  CheckpointPruner pruner_;
  std::optional<CheckpointWrite> pending_;
  std::int64_t step_ = 0;
};

}  // namespace ztrain
