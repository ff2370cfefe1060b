#include "ztrain/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ztrain/error.h"
#include "ztrain/random.h"

namespace ztrain {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open '" + path.string() + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError("'" + path.string() + "' is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw DataError("cannot map '" + path.string() + "': " + std::strerror(err));
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

TokenWindows::TokenWindows(std::vector<std::uint64_t> piece_tokens, int seq_len, std::uint64_t seed,
                           bool shuffle)
    : T_(seq_len), seed_(seed), shuffle_(shuffle) {
  std::uint64_t total = 0;
  for (const std::uint64_t n : piece_tokens) {
    first_.push_back(total);
    total += n > 0 ? (n - 1) / static_cast<std::uint64_t>(seq_len) : 0;
  }
  first_.push_back(total);
}

// The epoch's permutation runs over the windows of every piece, so an
// epoch mixes the pieces; the piece is then the last one starting at or
// before the window (pieces without windows start where the next does,
// and upper_bound steps past them).
TokenWindows::Place TokenWindows::place(std::uint64_t index) const {
  const std::uint64_t count = first_.back();
  const std::uint64_t epoch = index / count;
  std::uint64_t w = index % count;
  if (shuffle_) w = Permutation(count, hash_combine(seed_, epoch))(w);
  const auto next = std::upper_bound(first_.begin(), first_.end() - 1, w);
  const auto piece = static_cast<std::size_t>(next - first_.begin()) - 1;
  return {piece, (w - first_[piece]) * static_cast<std::uint64_t>(T_)};
}

}  // namespace ztrain
