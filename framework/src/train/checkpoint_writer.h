// Writing a checkpoint so that a crash at any moment leaves the last one
// whole.
//
// Every rank puts the state it saves (Strategy::save_state) into its own
// file in out_dir/step_<N>.tmp/, syncs it and lists its pieces beside it;
// once all have, rank 0 merges the lists into manifest.json, syncs the
// directory, renames it to step_<N>, and only then rewrites out_dir/latest
// (atomically) to name it; last it removes the checkpoints before the
// `keep_last` newest. A crash before the rename leaves a .tmp directory
// that no one reads (the next checkpoint of that step replaces it); after
// it, `latest` names either the old checkpoint or the new one, both whole.
// A failure on any rank (a full disk) stops every rank with the reason.
// The checkpoint directory must be one every rank can write and rank 0 can
// read (a shared file system across hosts).
//
// Test hook: ZTRAIN_TEST_KILL_IN_CHECKPOINT=STEP:K kills the process
// (SIGKILL) at the K-th point of the checkpoint of step STEP (a point: the
// directory made, each piece put, each file synced, the manifest, the
// rename, `latest`, the pruning).
//
// Errors: DataError naming the file and the reason.
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>

#include "train/checkpoint_manifest.h"
#include "ztrain/comm.h"
#include "ztrain/strategy.h"

namespace ztrain {

struct CheckpointWritten {
  std::filesystem::path dir;
  std::uint64_t bytes = 0;  // state bytes over all ranks
  double seconds = 0;
};

// `header`: the manifest without files and params (filled here from the
// ranks' pieces and `params`).
CheckpointWritten write_checkpoint(const std::filesystem::path& out_dir, std::int64_t keep_last,
                                   Manifest header, const std::vector<ParamSpec>& params,
                                   Strategy& strategy, Communicator& comm);

// "step_<N>"
std::string checkpoint_name(std::int64_t step);
// The step of a checkpoint directory's name (step_<N>), or -1.
std::int64_t checkpoint_step(const std::filesystem::path& dir);
// A checkpoint directory or one of its attempts (step_<N>, .tmp, .replaced).
bool is_checkpoint_dir(const std::filesystem::path& dir);

}  // namespace ztrain
