// Writing a checkpoint so that a crash at any moment leaves the last one
// whole, mostly while training goes on.
//
// A CheckpointWrite is one checkpoint in flight. Made at a step boundary,
// it has rank 0 make out_dir/step_<N>.tmp/, and every rank saves its state
// (Strategy::save_state) into its RankStateFile: a copy in host memory, which a
// background thread then writes into the rank's file, syncs and lists
// beside it, while the training thread goes on with the next steps (where
// the copy cannot be had, the rank writes within the step; see
// checkpoint/rank_file.h). The ranks learn together that every rank's
// write is done (the trainer carries rank_done() in its step agreement)
// and call finish(): rank 0 merges the lists into manifest.json, syncs the
// directory, renames it to step_<N>, and only then rewrites out_dir/latest
// (atomically) to name it; last it hands the checkpoints before the
// `keep_last` newest to the CheckpointPruner. A crash before the rename leaves a .tmp directory
// that no one reads (the next checkpoint of that step replaces it); after
// it, `latest` names either the old checkpoint or the new one, both whole.
// A failure on any rank (a full disk) stops every rank with the reason and
// rank 0 removes the partial directory. The checkpoint directory must be
// one every rank can write and rank 0 can read (a shared file system
// across hosts).
//
// Errors: DataError naming the file and the reason.
// Thread safety: collective (the constructor and finish()); the training
// thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "checkpoint/manifest.h"
#include "checkpoint/rank_file.h"
#include "job/out_dir_names.h"
#include "ztrain/comm.h"
#include "ztrain/strategy.h"

namespace ztrain {

struct CheckpointWritten {
  std::filesystem::path dir;
  std::uint64_t bytes = 0;  // state bytes over all ranks
  double seconds = 0;       // from the snapshot to the commit
  double held_s = 0;        // the training thread's part of it, on this rank:
  double copy_s = 0;        //   taking the state (the host copy, or the whole write)
  double commit_s = 0;      //   and finish(): waiting for the write, the commit
  bool background = false;  // this rank's file was written by the background thread
};

struct CheckpointTarget {
  std::filesystem::path out_dir;
  std::int64_t keep_last = 2;
  // Bytes this rank may copy into host memory to write in the background
  // (0: written within the step).
  std::uint64_t snapshot_allowance = 0;
  // A test's kill of this write (io/fault_plan.h).
  CheckpointKill kill;
  // This rank's place in its tensor group: a tensor-parallel run's state
  // is stored as the whole model's (checkpoint/tensor_parts.h).
  int tensor_rank = 0;
  // The whole model's parameters, which the manifest lists, under pipeline
  // parallelism (a stage's rank holds some of them); empty: the rank's own.
  ParamSpecs model_params = {};
};

// Removes old checkpoints off the training thread. prune() renames those
// past keep_last (and the attempts killed runs left) to step_<N>.removing
// at once, so no listing or later crash takes them for checkpoints, and a
// thread deletes them: unlinking a 1.5 GB rank file takes 0.3 s on ext4,
// which training need not wait for. One removal at a time: the next
// prune() and the destructor wait for the last. A checkpoint another process
// is reading (its read lock, checkpoint/read_lock.h) is left for a later
// prune. Rank 0's; DataError from
// prune() when the last removal failed, naming the path.
class CheckpointPruner {
 public:
  void prune(const std::filesystem::path& out_dir, std::int64_t keep_last);

 private:
  std::string error_;     // the last removal's failure
  std::jthread remover_;  // last: joined before error_ goes
};

class CheckpointWrite {
 public:
  // `header`: the manifest without files and params (filled in finish()
  // from the ranks' pieces and `params`, the model's: a tensor-parallel
  // rank's parts, listed whole).
  // `buffers` and `pruner` outlive it.
  CheckpointWrite(const CheckpointTarget& target, Manifest header, ParamSpecs params,
                  Strategy& strategy, SnapshotBuffers& buffers, CheckpointPruner& pruner,
                  Communicator& comm);
  // Waits for the background write; an uncommitted checkpoint's directory
  // is removed (also when the constructor throws: tmp_guard_).
  ~CheckpointWrite() = default;
  CheckpointWrite(const CheckpointWrite&) = delete;
  CheckpointWrite& operator=(const CheckpointWrite&) = delete;

  // This rank's file is written (or failed); never blocks.
  bool rank_done() const { return done_.load(std::memory_order_acquire); }
  // Every rank wrote its file within the constructor (none in the
  // background): the checkpoint can be committed at once. The same on
  // every rank.
  bool written_in_step() const { return written_in_step_; }
  // Collective: waits for this rank's write, then commits.
  CheckpointWritten finish();

 private:
  void make_directory();
  void save_state(Strategy& strategy, SnapshotBuffers& buffers);

  CheckpointTarget target_;
  Manifest header_;
  ParamSpecs params_;
  CheckpointPruner& pruner_;
  Communicator& comm_;
  std::filesystem::path dir_, tmp_;
  // Rank 0 removes the temporary directory unless it was committed.
  struct TmpGuard {
    std::filesystem::path dir;
    bool lead = false, committed = false;
    ~TmpGuard();
  } tmp_guard_;
  std::chrono::steady_clock::time_point t0_;
  double copy_s_ = 0;
  bool background_ = false;
  bool written_in_step_ = false;
  CrashPoints crash_;
  std::unique_ptr<RankStateFile> file_;
  std::string error_;  // the background write's failure
  std::atomic<bool> done_{false};
  std::jthread writer_;  // last: joined before anything above goes
};

}  // namespace ztrain
