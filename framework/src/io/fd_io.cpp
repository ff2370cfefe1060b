#include "io/fd_io.h"

#include <unistd.h>

#include <cerrno>

namespace ztrain {

int read_at(int fd, void* dst, std::uint64_t bytes, std::uint64_t at) {
  auto* p = static_cast<char*>(dst);
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t r = ::pread(fd, p + done, bytes - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno;
    if (r == 0) return kEndOfFile;
    done += static_cast<std::uint64_t>(r);
  }
  return 0;
}

int write_all(int fd, const void* src, std::uint64_t bytes) {
  const auto* p = static_cast<const char*>(src);
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t w = ::write(fd, p + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    done += static_cast<std::uint64_t>(w);
  }
  return 0;
}

}  // namespace ztrain
