// What keeps a checkpoint that another process is reading (`ztrain
// export`, `checkpoint info`, a resume from a run still training) from
// being pruned under it.
//
// A reader takes a shared flock on the checkpoint's manifest.json for as
// long as it reads (CheckpointReadLock, held by a Checkpoint); the pruner
// takes an exclusive one, without waiting, before it renames a checkpoint
// away (CheckpointRemoval): one being read is kept until a later prune
// finds it free. The reader's window between reading `latest` and taking
// its lock is closed by checking, once locked, that the manifest it locked
// is still the one at that path: a checkpoint renamed away in between is
// CheckpointGone, and the reader looks at `latest` again
// (Checkpoint::open). On NFS, flock is a POSIX lock of the whole file,
// which is why the pruner opens the manifest for writing.
//
// Errors: CheckpointGone as above; DataError when the manifest cannot be
// opened for another reason. Thread safety: each object one thread's.
#pragma once

#include <filesystem>

#include "ztrain/error.h"

namespace ztrain {

// The checkpoint a reader was about to open was pruned (or replaced) first.
class CheckpointGone final : public DataError {
 public:
  using DataError::DataError;
};

class CheckpointReadLock {
 public:
  // Blocks while a pruner holds the checkpoint (a rename: moments).
  explicit CheckpointReadLock(const std::filesystem::path& dir);
  CheckpointReadLock(CheckpointReadLock&& other) noexcept;
  CheckpointReadLock& operator=(CheckpointReadLock&&) = delete;
  CheckpointReadLock(const CheckpointReadLock&) = delete;
  ~CheckpointReadLock();

 private:
  int fd_ = -1;
};

class CheckpointRemoval {
 public:
  explicit CheckpointRemoval(const std::filesystem::path& dir);
  CheckpointRemoval(const CheckpointRemoval&) = delete;
  CheckpointRemoval& operator=(const CheckpointRemoval&) = delete;
  ~CheckpointRemoval();
  // Whether no reader holds the checkpoint; while this object lives, none
  // can start.
  bool free() const { return free_; }

 private:
  int fd_ = -1;
  bool free_ = true;
};

}  // namespace ztrain
