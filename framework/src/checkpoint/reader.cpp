#include "checkpoint/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "core/hold_points.h"
#include "io/crc32c.h"
#include "io/durable_file.h"
#include "io/fd_io.h"
#include "io/read_ahead.h"
#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;

fs::path Checkpoint::locate(const fs::path& path) {
  if (fs::exists(path / "manifest.json")) return path;
  if (fs::exists(path / "latest")) {
    std::string name = read_whole_file(path / "latest");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    const fs::path dir = path / name;
    if (name.empty() || name.find('/') != std::string::npos || !fs::exists(dir / "manifest.json"))
      throw DataError("'" + (path / "latest").string() + "' names '" + name +
                      "', which is not a checkpoint there; give a step_<N> directory instead");
    return dir;
  }
  if (!fs::exists(path))
    throw DataError("no checkpoint at '" + path.string() + "': no such directory");
  throw DataError("no checkpoint at '" + path.string() +
                  "': neither a checkpoint (manifest.json) nor a run directory with `latest`; "
                  "is checkpoint_every set in the run that wrote it?");
}

// Up to four times: a run writing a checkpoint every few milliseconds
// could prune each one `latest` names before this locks it, but not for
// long (its steps take longer than a lock).
Checkpoint Checkpoint::open(const fs::path& path) {
  for (int attempt = 1;; ++attempt) {
    const fs::path dir = locate(path);
    hold_point("checkpoint_located");
    try {
      Checkpoint c(dir);
      hold_point("checkpoint_opened");
      return c;
    } catch (const CheckpointGone& e) {
      if (dir == path || attempt == 4) throw;
      std::fprintf(stderr, "note: %s; reading the one `latest` names now\n", e.what());
    }
  }
}

Checkpoint::Checkpoint(const fs::path& dir)
    : lock_(dir),
      dir_(dir),
      manifest_(parse_manifest(read_whole_file(dir / "manifest.json"), dir / "manifest.json")) {
  for (const RankFile& f : manifest_.files) {
    const fs::path p = dir / f.name;
    std::error_code ec;
    const std::uint64_t size = fs::file_size(p, ec);
    if (ec)
      throw DataError("checkpoint '" + dir.string() + "': rank file '" + p.string() +
                      "' is missing (" + ec.message() + "); the checkpoint is incomplete");
    if (size != f.bytes)
      throw DataError("checkpoint '" + dir.string() + "': rank file '" + p.string() + "' has " +
                      std::to_string(size) + " bytes, the manifest says " +
                      std::to_string(f.bytes) + "; it is truncated or was replaced");
  }
}

void Checkpoint::check_model(const ParamSpecs& params) const {
  const auto& mine = manifest_.params;
  const std::string where = (dir_ / "manifest.json").string();
  if (mine.size() != params.size())
    throw DataError(where + ": the checkpoint holds " + std::to_string(mine.size()) +
                    " parameters, this run's model has " + std::to_string(params.size()) +
                    "; it was written by another model");
  for (ParamId p : params.ids())
    if (mine[p].name != params[p].name || Shape(mine[p].shape) != params[p].shape)
      throw DataError(where + ": parameter " + to_string(p) + " is " + mine[p].name + " " +
                      Shape(mine[p].shape).str() + " in the checkpoint, " + params[p].name + " " +
                      params[p].shape.str() +
                      " in this run's model; it was written by another "
                      "model");
  for (ParamId p : params.ids())
    if (mine[p].frozen == params[p].trainable)
      throw DataError(where + ": parameter " + params[p].name + " is " +
                      (mine[p].frozen ? "frozen" : "trained") + " in the checkpoint and " +
                      (params[p].trainable ? "trained" : "frozen") +
                      " in this run; the fine-tuning method changed (LoRA, freeze): start a new "
                      "run from the weights instead");
}

std::uint64_t Checkpoint::verify() const {
  CheckpointSource source(*this);
  std::vector<float> out(kBlockElements);
  for (ParamId p : manifest_.params.ids())
    for (const StatePiece& s : manifest_.params[p].pieces) {
      const std::uint64_t n = (s.count + kBlockElements - 1) / kBlockElements;
      for (std::uint64_t b = 0; b < n; ++b) source.read_blocks(p, s, b, b + 1, out.data());
    }
  return source.bytes_read();
}

namespace {

void read_exactly(int fd, const fs::path& path, char* dst, std::uint64_t bytes, std::uint64_t at) {
  if (const int e = read_at(fd, dst, bytes, at))
    throw DataError("cannot read '" + path.string() + "' bytes " + std::to_string(at) + "-" +
                    std::to_string(at + bytes) + ": " +
                    (e == kEndOfFile ? "end of file" : std::strerror(e)));
}

// Whether bytes [begin, end) of a mapping are all in the page cache.
bool in_memory(const MappedFile& file, std::uint64_t begin, std::uint64_t end) {
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  begin = begin / page * page;
  std::vector<unsigned char> pages((end - begin + page - 1) / page);
  if (::mincore(const_cast<std::uint8_t*>(file.data()) + begin, end - begin, pages.data()) != 0)
    return false;
  return std::all_of(pages.begin(), pages.end(), [](unsigned char v) { return (v & 1) != 0; });
}

}  // namespace

// A rank file read from disk is read ahead of the ranges asked for, 64 MiB
// past the end of the current one, 8 MiB per request to the kernel.
constexpr std::uint64_t kReadAhead = std::uint64_t{64} << 20;
constexpr std::uint64_t kReadAheadStep = std::uint64_t{8} << 20;

CheckpointSource::CheckpointSource(const Checkpoint& checkpoint)
    : checkpoint_(checkpoint),
      fds_(checkpoint.manifest().files.size(), -1),
      maps_(checkpoint.manifest().files.size()),
      cached_(checkpoint.manifest().files.size(), false),
      ahead_(checkpoint.manifest().files.size()) {}

CheckpointSource::~CheckpointSource() {
  ahead_.clear();  // their threads use the descriptors
  for (int f : fds_)
    if (f >= 0) ::close(f);
}

fs::path CheckpointSource::path(int file) const {
  return checkpoint_.dir() / checkpoint_.manifest().files[static_cast<std::size_t>(file)].name;
}

int CheckpointSource::fd(int file) {
  int& f = fds_.at(static_cast<std::size_t>(file));
  if (f < 0) {
    f = ::open(path(file).c_str(), O_RDONLY | O_CLOEXEC);
    if (f < 0)
      throw DataError("cannot open '" + path(file).string() + "': " + std::strerror(errno));
  }
  return f;
}

const MappedFile& CheckpointSource::map(int file) {
  const auto f = static_cast<std::size_t>(file);
  if (!maps_.at(f)) {
    maps_[f].emplace(path(file));
    cached_[f] = in_memory(*maps_[f], 0, maps_[f]->size());
    if (!cached_[f])
      ahead_[f] =
          std::make_unique<ReadAhead>(fd(file), maps_[f]->size(), kReadAhead, kReadAheadStep);
  }
  return *maps_[f];
}

// A range is served by the faster way for where its rank file is: a file
// wholly in the page cache when first opened (mincore says) has each block
// copied out of its mapping into `out` and checksummed in the same pass
// (crc32c_copy); any other has kReadBlocks blocks at a time read with one
// pread() into `out` and each block checksummed after, each range first
// advised to the kernel (WILLNEED: its readahead of the whole range keeps
// the disk busy) while a ReadAhead thread asks for the 64 MiB after it, so
// the disk has the next range in hand while this one is checked (a load
// asks for ranges in file order: master, m and v of a shard in turn, as
// they were written). Either way a checksum covers what the caller receives,
// and from two blocks on a second thread serves the second half of the
// blocks at the same time. Measured through resumes of gpt2-124m (2 cores;
// a plain read() of each rank file as the reference, bench/RESULTS.md):
// pread() and a checksum after were 77 % of the plain read warm at world 1
// and 63 % at world 2 (the checksum a second pass over memory), the fused
// copy 149 % and 100 %; from disk the fused copy (page faults) fell to 98 %
// and 69 % of plain where pread() groups of 8 MiB gave 127 % and 156 %.
// Deciding per range rather than per file was slower from disk than
// either way: the readahead of one range made the next one look cached,
// and copying it through the mapping while the disk still filled the
// cache (1.5-2.0 s against 1.4-1.6 s for 1.48 GB). The read-ahead past
// each range took a cold resume of two 742 MB files from 1.18-1.50 s to
// 0.98-1.22 s (four alternating pairs).
constexpr std::uint64_t kReadBlocks = 8;

void CheckpointSource::read_blocks(ParamId p, const StatePiece& s, std::uint64_t b0,
                                   std::uint64_t b1, float* out) {
  const MappedFile& file = map(s.file);
  const int descriptor = fd(s.file);  // opened here: the helper below only reads
  const auto length = [&](std::uint64_t b) {
    return std::min(kBlockElements, s.count - b * kBlockElements) * sizeof(float);
  };
  const auto at = [&](std::uint64_t b) { return s.offset + b * kBlockElements * sizeof(float); };
  const auto block = [&](std::uint64_t b) {
    return reinterpret_cast<char*>(out + (b - b0) * kBlockElements);
  };
  const auto check = [&](std::uint64_t b, std::uint32_t crc) {
    if (crc == s.crcs[b]) return;
    const std::uint64_t e = s.first + b * kBlockElements;
    throw DataError("checkpoint '" + checkpoint_.dir().string() + "': bytes [" +
                    std::to_string(at(b)) + ", " + std::to_string(at(b) + length(b)) + ") of '" +
                    file.path().string() + "' (" + checkpoint_.manifest().params[p].name + "'s " +
                    std::string(state_array_name(s.array)) + ", elements [" + std::to_string(e) +
                    ", " + std::to_string(e + length(b) / sizeof(float)) +
                    ")) fail their checksum; the file is corrupt: resume from an earlier "
                    "checkpoint");
  };
  const std::uint64_t first_byte = at(b0), end_byte = at(b1 - 1) + length(b1 - 1);
  const bool cached = cached_[static_cast<std::size_t>(s.file)];
  // Blocks [from, to), each read and checked; stops early when asked.
  const auto read_checked = [&](std::uint64_t from, std::uint64_t to, std::stop_token stop) {
    for (std::uint64_t b = from; b < to && !stop.stop_requested(); b += kReadBlocks) {
      const std::uint64_t last = std::min(to, b + kReadBlocks);
      if (cached) {
        for (std::uint64_t c = b; c < last; ++c)
          check(c, crc32c_copy(block(c), file.data() + at(c), length(c)));
      } else {
        const std::uint64_t begin = at(b), end = at(last - 1) + length(last - 1);
        read_exactly(descriptor, file.path(), block(b), end - begin, begin);
        for (std::uint64_t c = b; c < last; ++c) check(c, crc32c(block(c), length(c)));
      }
    }
  };
  // What follows this range is read ahead while this one is read.
  if (!cached) ahead_[static_cast<std::size_t>(s.file)]->at(end_byte);
  if (b1 - b0 < 2) {
    read_checked(b0, b1, {});
  } else {
    if (!cached)
      ::posix_fadvise(descriptor, static_cast<off_t>(first_byte),
                      static_cast<off_t>(end_byte - first_byte), POSIX_FADV_WILLNEED);
    const std::uint64_t mid = b0 + (b1 - b0) / 2;
    std::exception_ptr second;
    {
      // A failure in the first half leaves this scope by its exception:
      // the helper is asked to stop and joined before `out` may go away.
      std::jthread helper([&](std::stop_token stop) {
        try {
          read_checked(mid, b1, stop);
        } catch (...) {
          second = std::current_exception();
        }
      });
      read_checked(b0, mid, {});
      helper.join();  // not by the destructor, which would ask it to stop
    }
    if (second) std::rethrow_exception(second);
  }
  bytes_read_ += (std::min(s.count, b1 * kBlockElements) - b0 * kBlockElements) * sizeof(float);
}

void CheckpointSource::get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                           float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const ParamState& ps = checkpoint_.manifest().params.at(p);
  std::uint64_t covered = 0;
  for (const StatePiece& s : ps.pieces) {
    if (s.array != a) continue;
    const std::uint64_t lo = std::max(first, s.first),
                        hi = std::min(first + count, s.first + s.count);
    if (lo >= hi) continue;
    // Blocks wholly inside [lo, hi) are read straight into `out`; a block
    // the range only partly covers (its ends, when they are not a block's)
    // goes through blocks_, since its checksum covers the whole block.
    const std::uint64_t rlo = lo - s.first, rhi = hi - s.first;  // relative to the piece
    const std::uint64_t b0 = rlo / kBlockElements;
    const std::uint64_t b1 = (rhi + kBlockElements - 1) / kBlockElements;
    const auto whole = [&](std::uint64_t b) {
      return b * kBlockElements >= rlo && std::min((b + 1) * kBlockElements, s.count) <= rhi;
    };
    const auto partial = [&](std::uint64_t b) {
      blocks_.resize(kBlockElements);
      read_blocks(p, s, b, b + 1, blocks_.data());
      const std::uint64_t from = std::max(rlo, b * kBlockElements);
      const std::uint64_t to = std::min(rhi, (b + 1) * kBlockElements);
      std::copy(blocks_.begin() + static_cast<std::ptrdiff_t>(from - b * kBlockElements),
                blocks_.begin() + static_cast<std::ptrdiff_t>(to - b * kBlockElements),
                out + (s.first + from - first));
    };
    std::uint64_t m0 = b0, m1 = b1;  // the whole blocks
    if (!whole(b0)) partial(m0++);
    if (m1 > m0 && !whole(m1 - 1)) partial(--m1);
    if (m1 > m0) read_blocks(p, s, m0, m1, out + (s.first + m0 * kBlockElements - first));
    covered += hi - lo;
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (covered != count)
    throw DataError("checkpoint '" + checkpoint_.dir().string() + "' holds " +
                    std::to_string(covered) + " of elements [" + std::to_string(first) + ", " +
                    std::to_string(first + count) + ") of " + ps.name + "'s " +
                    std::string(state_array_name(a)));
}

}  // namespace ztrain
