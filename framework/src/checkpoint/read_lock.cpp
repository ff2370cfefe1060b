#include "checkpoint/read_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ztrain {
namespace fs = std::filesystem;

CheckpointReadLock::CheckpointReadLock(const fs::path& dir) {
  const fs::path manifest = dir / "manifest.json";
  fd_ = ::open(manifest.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0 && errno == ENOENT)
    throw CheckpointGone("checkpoint '" + dir.string() + "' is gone (pruned or replaced)");
  if (fd_ < 0) throw DataError("cannot open '" + manifest.string() + "': " + std::strerror(errno));
  // A file system without locks (ENOLCK) leaves the read unprotected, as
  // it leaves the pruner free.
  while (::flock(fd_, LOCK_SH) != 0 && errno == EINTR) {
  }
  // Renamed away between the open and the lock: the path is another file
  // now, or none.
  struct stat locked {
  }, now{};
  if (::fstat(fd_, &locked) != 0 || ::stat(manifest.c_str(), &now) != 0 ||
      locked.st_ino != now.st_ino || locked.st_dev != now.st_dev) {
    ::close(fd_);
    throw CheckpointGone("checkpoint '" + dir.string() +
                         "' was pruned or replaced while being opened");
  }
}

CheckpointReadLock::CheckpointReadLock(CheckpointReadLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

CheckpointReadLock::~CheckpointReadLock() {
  if (fd_ >= 0) ::close(fd_);
}

CheckpointRemoval::CheckpointRemoval(const fs::path& dir) {
  fd_ = ::open((dir / "manifest.json").c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) return;  // no manifest: nothing a reader could hold
  int r;
  while ((r = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  free_ = r == 0 || errno != EWOULDBLOCK;
}

CheckpointRemoval::~CheckpointRemoval() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ztrain
