// Files that are either whole or absent: the one way ztrain writes a file
// that must survive a crash (weights, checkpoints, their manifests, the
// `latest` pointer).
//
// DurableFile writes through a buffer and, in finish(), syncs the data to
// the disk before closing; a caller renames the finished file into place
// and syncs the directory (sync_directory) so the rename itself survives a
// power cut. write_file_atomically does all of it for a small file: a
// temporary beside the target, synced, renamed over the target, the
// directory synced; a reader sees the old file or the new one, never a
// part. Part of the host.
//
// A test's fault (io/fault_plan.h: ZTRAIN_TEST_INJECT_WRITE_ERROR, handed
// over by plan_write_error) fails every durable write after its first
// megabyte with ENOSPC or EIO, as a disk that fills or fails half-way.
//
// Errors: DataError naming the path, the system's reason and, for a full
// disk, what to do.
// Thread safety: a DurableFile is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ztrain {

class DurableFile {
 public:
  // Creates (or truncates) `path`.
  explicit DurableFile(const std::filesystem::path& path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, std::size_t n);
  // Bytes written so far (the next write's offset in the file).
  std::uint64_t size() const { return size_; }
  // Writes what is buffered, syncs and closes.
  void finish();
  const std::filesystem::path& path() const { return path_; }

 private:
  void flush();
  void write_through(const char* p, std::size_t n);
  [[noreturn]] void fail(const char* what);

  std::filesystem::path path_;
  int inject_ = 0;
  std::uint64_t size_ = 0, written_ = 0;
  std::vector<char> buffer_;
  std::size_t used_ = 0;
  int fd_ = -1;
};

// From now on every DurableFile's writes fail with `error` past their
// first megabyte (0: none).
void plan_write_error(int error);

// Syncs a directory, so the names created or renamed in it are durable.
void sync_directory(const std::filesystem::path& dir);
// Renames `from` to `to` (replacing it) and syncs `to`'s directory.
void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to);
// `contents` into `path` as described above.
void write_file_atomically(const std::filesystem::path& path, const std::string& contents);
// The whole of a (small) file such a write left: a manifest, `latest`.
std::string read_whole_file(const std::filesystem::path& path);

}  // namespace ztrain
