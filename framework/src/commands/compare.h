// `ztrain compare`: one run under several strategies, side by side.
//
// Each strategy trains as its own job (`ztrain --strategy S [--nproc N]`,
// this binary) on the same run file, overrides, seed and data, into
// OUT/<strategy>/, with every step logged and a validation loss at the
// end; its console output goes to OUT/<strategy>.log and a progress line
// says which strategy is running and its step. A job that fails, out of
// memory or otherwise, is recorded as such and the comparison goes on.
// Then the figures are read back from each job's metrics.jsonl, the
// equivalence verdict is taken (compare_report.h), and the table is
// printed and written to OUT/compare.csv, OUT/compare.json and
// OUT/compare.html.
//
// Errors: ConfigError for bad arguments or a run file that does not load
// (before any job starts) and for an OUT that holds an earlier comparison
// (--overwrite replaces it); DataError when a job's metrics cannot be read.
// Thread safety: one call at a time (it starts processes).
#pragma once

#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace ztrain {

struct CompareArgs {
  // The run every job trains (its strategy and DeepSpeed config unset;
  // overwrite: replace an earlier comparison in out_dir).
  TrainArgs run;
  std::vector<std::string> strategies;  // presets, plugin names or paths
  int nproc = 1;                        // ranks per job (mpirun when > 1)
  std::optional<std::int64_t> steps;    // none: the run file's train.steps
  std::filesystem::path out_dir;        // empty: runs/compare
  // A test's perturbation (io/fault_plan.h): "STRATEGY:STEP" runs that
  // strategy's job with ZTRAIN_TEST_SCALE_LR=STEP, so it differs from the
  // others from step STEP + 1 on. Empty: none.
  std::string perturb;
  std::string command_line;  // for the report's metadata
};

// Returns the exit status: 0 when every job completed or ran out of memory
// and the completed ones agree; 1 when they disagree or a job failed
// otherwise.
int compare(const CompareArgs& args, std::ostream& os);

}  // namespace ztrain
