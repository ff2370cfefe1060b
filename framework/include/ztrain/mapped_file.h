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

// Which window of a token stream is sequence `index`: the stream of n tokens
// is cut into floor((n-1)/T) windows of T+1 tokens overlapping by one (the
// last target of one is the first input of the next); epochs repeat them in
// a fresh seeded order when `shuffle` is set.
class ZTRAIN_API TokenWindows {
 public:
  TokenWindows(std::uint64_t n_tokens, int seq_len, std::uint64_t seed, bool shuffle);
  std::uint64_t count() const { return count_; }
  // Offset of the first token of sequence `index`.
  std::uint64_t start(std::uint64_t index) const;

 private:
  std::uint64_t count_;
  int T_;
  std::uint64_t seed_;
  bool shuffle_;
};

}  // namespace ztrain
