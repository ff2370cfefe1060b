// What a run will write, checked before it trains.
//
// A run writes config.toml and metrics.jsonl into out_dir, the final
// weights there (save_final) and a copy to export_to. Found only at the end,
// a second run over the first one's directory, a disk without room, or an
// export path that cannot be written would lose work; so before the first
// step (checkpoints count among out_dir's files and bytes; a resumed run
// expects its directory)
// step rank 0 checks: no other job holds out_dir (rank 0 takes its lock,
// out_dir_lock.h, kept for the run's life), out_dir holds no earlier run (unless --overwrite, which
// then clears that run's files so none is left mixed with the new one; a start that failed before
// its first step left no run), export_to can be created and written, an existing export_to file is
// not replaced without
// --overwrite, and each file system has room for the weights it will
// receive. Every rank learns the verdict, so all stop together.
//
// Errors: ConfigError naming the path and what to do (on rank 0 the
// reason; on the others that rank 0 refused).
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "job/out_dir_lock.h"

#include "ztrain/comm.h"
#include "ztrain/dtype.h"

namespace ztrain {

struct RunOutputs {
  std::filesystem::path out_dir;
  bool save_final = true;
  std::filesystem::path export_to;  // empty: none
  DType export_dtype = DType::f32;
  std::int64_t n_params = 0;
  bool overwrite = false;
  std::uint64_t checkpoint_bytes = 0;     // the checkpoints out_dir will hold at once
  bool resuming = false;                  // continuing a checkpoint: its run directory is expected
  std::filesystem::path tensorboard_dir;  // empty: none
};

// Rank 0 takes the lock of out_dir (made if missing) and prints what the
// lock has to say; null on the other ranks. Every rank stops (ConfigError)
// when rank 0 cannot take it. Taken as soon as the run is known, before a
// resumed run reads its checkpoint from a directory another job may be
// pruning.
std::unique_ptr<OutDirLock> lock_out_dir(const std::filesystem::path& out_dir, Communicator& comm);

// The rest of the checks (rank 0 holds `lock`, which a refusal releases).
void check_run_outputs(const RunOutputs& outputs, std::unique_ptr<OutDirLock>& lock,
                       Communicator& comm);

}  // namespace ztrain
