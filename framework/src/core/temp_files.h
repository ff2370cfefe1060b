// TempFiles: files that must not outlive the process, however it ends.
//
// The NVMe tier's swap files hold gigabytes that mean nothing once the run
// is over. A TempFile removes its file when destroyed (normal exit, an
// exception unwinding); while it exists its path is also registered here:
// the process's signal handler (core/signals.h) unlinks every registered
// path on SIGINT, SIGTERM and SIGHUP, and remove_temp_files() does the same
// for paths that end the process themselves (a collective timeout's abort).
// In libztrain, exported to the host (ZTRAIN_KIT).
//
// Thread safety: register and remove from any thread; the signal handler
// only calls unlink on preallocated paths.
#pragma once

#include <filesystem>

#include "kit/kit_export.h"

namespace ztrain {

class ZTRAIN_KIT TempFile {
 public:
  explicit TempFile(std::filesystem::path path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int slot_;
};

// Unlinks every registered path (async-signal-safe).
ZTRAIN_KIT void remove_temp_files() noexcept;

}  // namespace ztrain
