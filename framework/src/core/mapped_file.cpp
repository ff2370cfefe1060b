#include "ztrain/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

TokenWindows::TokenWindows(std::uint64_t n_tokens, int seq_len, std::uint64_t seed, bool shuffle)
    : count_(n_tokens > 0 ? (n_tokens - 1) / static_cast<std::uint64_t>(seq_len) : 0),
      T_(seq_len),
      seed_(seed),
      shuffle_(shuffle) {}

std::uint64_t TokenWindows::start(std::uint64_t index) const {
  const std::uint64_t epoch = index / count_;
  std::uint64_t w = index % count_;
  if (shuffle_) w = Permutation(count_, hash_combine(seed_, epoch))(w);
  return w * static_cast<std::uint64_t>(T_);
}

}  // namespace ztrain
