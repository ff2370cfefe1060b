// The lock a run holds on its out_dir for its whole life, so that a second
// job naming the same directory (by mistake, or with --overwrite or
// --resume) cannot delete or interleave with a live run's files: it is
// refused, naming the holder's host and pid.
//
// Taking it makes out_dir where it is missing; releasing it removes what it
// made when the run left nothing there (a start that failed).
//
// The lock is flock() on out_dir/.ztrain.lock, which the kernel releases
// when the holding process ends, however it ends: a lock file left by a run
// that died is free to take, and the note says whose it was. The file
// records host, pid and start time, for the refusal and that note. Where the
// file system has no locks, the run goes on with a note that nothing keeps
// a second job out.
//
// Errors: ConfigError naming the directory and the holder (held), or the
// system's reason (the file cannot be made).
// Thread safety: one object per run, on the training thread.
#pragma once

#include <filesystem>
#include <string>

namespace ztrain {

class OutDirLock {
 public:
  // Takes the lock of `out_dir`, making the directory first if needed.
  // `note` receives a line to print when there is something to say (a dead
  // run's lock taken over, a file system without locks), else stays empty.
  OutDirLock(const std::filesystem::path& out_dir, std::string& note);
  // Removes the lock file, releases the lock, then the directories it made
  // that are empty.
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

  static constexpr const char* kFileName = ".ztrain.lock";

 private:
  std::filesystem::path file_;
  std::filesystem::path made_;  // the topmost directory it made; empty: none
  int fd_ = -1;
};

}  // namespace ztrain
