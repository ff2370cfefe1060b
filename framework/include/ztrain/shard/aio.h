// AioEngine: asynchronous direct file I/O for the NVMe tier, on io_uring.
//
// The NVMe tier keeps state (optimizer shards, parameter shards) in swap
// files and moves it through host buffers. The engine opens each swap file
// with O_DIRECT (the page cache would only double the memory and the
// copies), reserves its size on disk when it is created (so a full disk is
// found before training, not half-way through a step), and runs transfers
// asynchronously: a request is split into pieces of `block_size` bytes and
// up to `queue_depth` pieces are in flight at once, submitted and reaped by
// the engine's own thread, so the caller computes meanwhile and waits only
// for the request it needs. The options are DeepSpeed's `aio` keys.
//
// Direct I/O wants aligned transfers: buffers on kAlign (4096) bytes, file
// offsets and lengths multiples of it (the device's large allocations are
// so aligned). Swap files are removed when the engine is destroyed, and
// however the process ends (core's temporary-file registry).
//
// Errors: IoError naming the path and what to do: a directory that does not
// exist or is not writable, a file system that is memory (tmpfs, ramfs:
// swap files there would only take RAM) or has no direct I/O, a
// disk without room for the file (the bytes needed and free), a failed
// transfer (the errno, the file and the offset).
// Thread safety: any thread may issue and wait; a request's buffer must
// stay valid until wait() returned.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "ztrain/export.h"
#include "ztrain/options.h"

namespace ztrain::shard {

struct AioOptions {
  std::uint64_t block_size = 1 << 20;  // bytes per piece
  int queue_depth = 8;                 // pieces in flight
  bool single_submit = false;          // submit each piece on its own instead of in batches
};

// aio.block_size, aio.queue_depth, aio.single_submit, and DeepSpeed's
// aio.intra_op_parallelism and aio.overlap_events (accepted; the engine's
// one thread always overlaps its requests with the caller).
ZTRAIN_API void declare_aio_options(OptionList& o);
ZTRAIN_API AioOptions aio_options(const Options& o);

class ZTRAIN_API AioEngine {
 public:
  static constexpr std::uint64_t kAlign = 4096;
  // A pending transfer.
  class Ticket {
   public:
    Ticket() = default;
    bool valid() const { return state_ != nullptr; }

   private:
    friend class AioEngine;
    std::shared_ptr<void> state_;
  };

  explicit AioEngine(const AioOptions& options);
  ~AioEngine();
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;

  // A swap file of `bytes` (rounded up to kAlign) in `dir`, named
  // ztrain-swap@<host>@<pid>@<name>; returns its handle. Swap files that
  // runs of this host killed before they could remove them are removed
  // first (saying so on stderr); other runs' files are named when the disk
  // has no room.
  int create(const std::filesystem::path& dir, const std::string& name, std::uint64_t bytes);
  const std::filesystem::path& path(int file) const;
  Ticket read(int file, std::uint64_t offset, void* buffer, std::uint64_t bytes);
  Ticket write(int file, std::uint64_t offset, const void* buffer, std::uint64_t bytes);
  // Returns when the transfer is done; raises its IoError.
  void wait(Ticket& ticket);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ztrain::shard
