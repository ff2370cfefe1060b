// The checkpoint reader's read-ahead: what it brings into the page cache is
// seen with mincore() on a file whose pages were first dropped (DONTNEED
// drops a file's clean pages; where the file system keeps any of them, as
// tmpfs keeps all, the test says so and checks nothing).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "io/read_ahead.h"
#include "support.h"

using namespace ztrain;

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// The share of [begin, end) of the mapping in the page cache.
double resident(const void* map, std::uint64_t begin, std::uint64_t end) {
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((end - begin + page - 1) / page);
  ::mincore(const_cast<char*>(static_cast<const char*>(map)) + begin, end - begin, in.data());
  std::size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return static_cast<double>(n) / static_cast<double>(in.size());
}

// Waits up to 10 s for all of [begin, end) to be in the page cache.
bool arrives(const void* map, std::uint64_t begin, std::uint64_t end) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (resident(map, begin, end) < 1.0) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

TEST_CASE("read-ahead keeps a window past the reader in the page cache, and reads no further") {
  test::TempDir dir;
  const auto path = dir.path() / "state.bin";
  const std::uint64_t size = 96 * kMiB;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  const std::vector<char> chunk(kMiB, 7);
  for (std::uint64_t at = 0; at < size; at += kMiB) REQUIRE(::write(fd, chunk.data(), kMiB) > 0);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  if (resident(map, 0, size) > 0.0) {
    MESSAGE("this file system kept pages DONTNEED should drop (tmpfs?): nothing to measure");
  } else {
    ReadAhead ahead(fd, size, 16 * kMiB, 4 * kMiB);
    // From the start: the first 16 MiB, nothing past them.
    CHECK(arrives(map, 0, 16 * kMiB));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(resident(map, 16 * kMiB, size) == 0.0);
    // The reader jumps forwards: the window follows, the bytes it skipped
    // stay unread.
    ahead.at(48 * kMiB);
    CHECK(arrives(map, 48 * kMiB, 64 * kMiB));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(resident(map, 16 * kMiB, 48 * kMiB) == 0.0);
    CHECK(resident(map, 64 * kMiB, size) == 0.0);
    // And back: the window starts again at the reader.
    ahead.at(20 * kMiB);
    CHECK(arrives(map, 20 * kMiB, 36 * kMiB));
    // Up to the end of the file, not past it.
    ahead.at(90 * kMiB);
    CHECK(arrives(map, 90 * kMiB, size));
  }
  ::munmap(map, size);
  ::close(fd);
}
