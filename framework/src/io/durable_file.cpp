#include "io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ztrain/error.h"

namespace ztrain {
namespace {

// Writes are gathered into pieces this large: checkpoints put many small
// tensors (biases, norms), and one system call per piece of a few MiB
// costs nothing next to the disk.
constexpr std::size_t kBufferBytes = std::size_t{4} << 20;
// A write this large goes straight to the file, not through the buffer: a
// checkpoint writes each 1 MiB block right after checksumming it, while it
// is still in the cache, and a copy into the buffer would undo that.
constexpr std::size_t kDirectBytes = std::size_t{1} << 20;

// The errno every durable write fails with (a test's fault plan); 0: none.
std::atomic<int> planned_write_error{0};

[[noreturn]] void fail_path(const char* what, const std::filesystem::path& path, int e) {
  throw DataError(std::string(what) + " '" + path.string() + "': " + std::strerror(e) +
                  (e == ENOSPC ? "; the disk is full: free space and try again (the partial "
                                 "file is removed)"
                               : ""));
}

}  // namespace

void plan_write_error(int error) {
  planned_write_error.store(error);
}

DurableFile::DurableFile(const std::filesystem::path& path)
    : path_(path), inject_(planned_write_error.load()) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create");
  buffer_.resize(kBufferBytes);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DurableFile::write(const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  size_ += n;
  if (n >= kDirectBytes) {
    flush();
    return write_through(p, n);
  }
  if (used_ + n > buffer_.size()) flush();
  std::memcpy(buffer_.data() + used_, p, n);
  used_ += n;
}

void DurableFile::flush() {
  write_through(buffer_.data(), used_);
  used_ = 0;
}

void DurableFile::write_through(const char* p, std::size_t n) {
  constexpr std::uint64_t kInjectAfter = std::uint64_t{1} << 20;
  while (n > 0) {
    std::size_t chunk = n;
    if (inject_) {
      if (written_ >= kInjectAfter) {
        errno = inject_;
        fail("cannot write");
      }
      chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, kInjectAfter - written_));
    }
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    written_ += static_cast<std::uint64_t>(w);
  }
}

void DurableFile::finish() {
  flush();
  if (::fsync(fd_) != 0) fail("cannot sync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close");
}

void DurableFile::fail(const char* what) {
  fail_path(what, path_, errno);
}

void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_path("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) fail_path("cannot sync directory", dir, e);
}

void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  if (ec)
    throw DataError("cannot move '" + from.string() + "' to '" + to.string() +
                    "': " + ec.message());
  sync_directory(to.parent_path());
}

void write_file_atomically(const std::filesystem::path& path, const std::string& contents) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  try {
    DurableFile f(tmp);
    f.write(contents.data(), contents.size());
    f.finish();
    rename_durably(tmp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot read '" + path.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ztrain
