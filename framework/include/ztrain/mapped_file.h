// MappedFile: a read-only memory map of a whole file, for data plugins.
//
// Ownership: unmaps on destruction; move-only. Errors: DataError naming the
// file and the system's reason. Thread safety: the bytes are immutable and
// may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

class ZTRAIN_API MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  ~MappedFile();

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// Which window of the token streams (pieces: files, or parts of one) is
// sequence `index`: a piece of n tokens is cut into floor((n-1)/T) windows
// of T+1 tokens overlapping by one (the last target of one is the first
// input of the next); no window crosses from one piece into the next. The
// windows of all pieces are numbered piece after piece, and epochs repeat
// them in a fresh seeded order over all pieces when `shuffle` is set.
// Sequence `index` is a pure function of the index, so a run resumed at
// any step reads what the uninterrupted run would, across pieces too.
class ZTRAIN_API TokenWindows {
 public:
  struct Place {
    std::size_t piece;
    std::uint64_t offset;  // of the window's first token in its piece
  };
  TokenWindows(std::vector<std::uint64_t> piece_tokens, int seq_len, std::uint64_t seed,
               bool shuffle);
  // Windows of all pieces.
  std::uint64_t count() const { return first_.back(); }
  Place place(std::uint64_t index) const;

 private:
  std::vector<std::uint64_t> first_;  // each piece's first window; then the total
  int T_;
  std::uint64_t seed_;
  bool shuffle_;
};

}  // namespace ztrain
