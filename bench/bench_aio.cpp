// bench_aio: the NVMe tier's I/O engine against a plain sequential direct
// read and write of the same bytes, in the same process.
//
// The engine (shard/aio.h) writes then reads back --size bytes of one swap
// file in requests of --request bytes (the swapper's sub-group buffers),
// each split into aio.block_size pieces with aio.queue_depth in flight. The
// plain loop opens a file in the same directory with O_DIRECT and moves the
// same bytes with one synchronous pwrite / pread after another, each of
// block_size x queue_depth bytes (as many bytes per call as the engine
// keeps in flight), on the calling thread. Neither syncs: both bypass the
// page cache. Rounds alternate engine and plain; prints GB/s of each and
// the engine's share of the plain rate (goal: at least 85 %), medians.
//
//   build/bin/bench_aio DIR [--size 1e9] [--request 64e6] [--rounds 3]
//                           [--block-size 1048576] [--queue-depth 8]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "stopwatch.h"
#include "ztrain/device.h"
#include "ztrain/shard/aio.h"

using namespace ztrain;
using bench::median;
using bench::timed;

namespace {

// A file opened for direct I/O, unlinked at once so it goes with the process.
class PlainFile {
 public:
  explicit PlainFile(const std::filesystem::path& dir) {
    const std::string path = (dir / ("bench-aio-plain-" + std::to_string(getpid()))).string();
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), path);
    unlink(path.c_str());
  }
  ~PlainFile() { close(fd_); }
  PlainFile(const PlainFile&) = delete;
  PlainFile& operator=(const PlainFile&) = delete;

  // One synchronous call after another, `chunk` bytes each.
  void transfer(bool write, std::byte* buffer, std::uint64_t bytes, std::uint64_t chunk) const {
    for (std::uint64_t at = 0; at < bytes; at += chunk) {
      const std::uint64_t n = std::min(chunk, bytes - at);
      const auto off = static_cast<off_t>(at);
      const ssize_t done =
          write ? pwrite(fd_, buffer + at, n, off) : pread(fd_, buffer + at, n, off);
      if (done < 0)
        throw std::system_error(errno, std::generic_category(), "plain direct transfer");
      if (done != static_cast<ssize_t>(n))
        throw std::runtime_error("plain direct transfer: " + std::to_string(done) + " of " +
                                 std::to_string(n) + " bytes");
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_aio DIR [--size B] [--request B] [--rounds N] "
                 "[--block-size B] [--queue-depth N]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::uint64_t size = 1000000000, request = 64000000;
  shard::AioOptions options;
  int rounds = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const auto value = static_cast<std::uint64_t>(std::atof(argv[i + 1]));
    if (a == "--size") size = value;
    if (a == "--request") request = value;
    if (a == "--rounds") rounds = std::max(1, static_cast<int>(value));
    if (a == "--block-size") options.block_size = value;
    if (a == "--queue-depth") options.queue_depth = static_cast<int>(value);
  }
  const std::uint64_t align = shard::AioEngine::kAlign;
  request = std::max(align, request / align * align);
  size = std::max(request, size / request * request);
  auto device = make_cpu_device(1);
  Buffer buffer = device->allocate(Tier::host, Category::offload, size);
  auto* bytes = static_cast<std::byte*>(buffer.data());
  for (std::uint64_t i = 0; i < size; i += 4096) bytes[i] = static_cast<std::byte>(i / 4096 * 7);

  shard::AioEngine engine(options);
  const int file = engine.create(dir, "bench", size);
  const auto engine_pass = [&](bool write) {
    std::vector<shard::AioEngine::Ticket> tickets;
    for (std::uint64_t at = 0; at < size; at += request)
      tickets.push_back(write ? engine.write(file, at, bytes + at, request)
                              : engine.read(file, at, bytes + at, request));
    for (auto& t : tickets) engine.wait(t);
  };
  const PlainFile plain(dir);
  const std::uint64_t chunk = options.block_size * static_cast<std::uint64_t>(options.queue_depth);

  std::vector<double> ew, er, pw, pr;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up (and writes the plain file)
    const double a = timed([&] { engine_pass(true); });
    const double b = timed([&] { engine_pass(false); });
    const double c = timed([&] { plain.transfer(true, bytes, size, chunk); });
    const double d = timed([&] { plain.transfer(false, bytes, size, chunk); });
    if (r == 0) continue;
    ew.push_back(a);
    er.push_back(b);
    pw.push_back(c);
    pr.push_back(d);
  }
  const auto gbs = [&](const std::vector<double>& t) {
    return static_cast<double>(size) / median(t) / 1e9;
  };
  std::printf(
      "%s: %.2f GB moved each way, requests of %.0f MB, block_size %llu, queue_depth %d, "
      "plain calls of %.1f MB; medians of %d rounds\n",
      dir.c_str(), static_cast<double>(size) / 1e9, static_cast<double>(request) / 1e6,
      static_cast<unsigned long long>(options.block_size), options.queue_depth,
      static_cast<double>(chunk) / 1e6, rounds);
  std::printf("write: engine %.2f GB/s, plain %.2f GB/s: %.0f%%\n", gbs(ew), gbs(pw),
              100.0 * gbs(ew) / gbs(pw));
  std::printf("read:  engine %.2f GB/s, plain %.2f GB/s: %.0f%%\n", gbs(er), gbs(pr),
              100.0 * gbs(er) / gbs(pr));
  return 0;
}
