// SwappedShard: a rank's owned parameter shard in a swap file (ZeRO-Infinity's
// offload_param.device = "nvme").
//
// The working parameters of the owned range [begin, end), in the run's
// precision, live in one file under `dir` (page-rounded, reserved when it
// is made) written and read through the NVMe tier's io_uring engine with
// direct I/O. A loan reads the pages holding the range asked for into a
// host buffer (offload) it owns; write() reads the edge pages it only
// partly covers first, so neighbouring elements survive; write_async()
// takes page-aligned pieces (the optimizer's sub-groups are cut so) and
// leaves them in flight. The file is accounted in the nvme tier (params).
//
// Ownership: owns its engine and file (removed with it, and however the
// process ends); staging buffers are the loans'.
// Errors: IoError from the engine (a missing or unwritable directory, a
// memory file system, a full disk, a failed transfer, each naming the
// path); InternalError for a range outside the shard or a misaligned
// write_async.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/shard/aio.h"
#include "ztrain/shard/owned_shard.h"

namespace ztrain::shard {

class ZTRAIN_API SwappedShard final : public OwnedShard {
 public:
  // Elements initialised or read at a time at start-up (a whole number of
  // pages in every dtype, so slices from a page start stay page-aligned).
  static constexpr std::uint64_t kSlice = std::uint64_t{1} << 22;

  // rank names the file; its contents start undefined (write them).
  SwappedShard(Device& device, std::uint64_t begin, std::uint64_t end, DType dtype,
               const std::filesystem::path& dir, const AioOptions& aio, int rank);
  ~SwappedShard() override;

  Tier tier() const override { return Tier::nvme; }
  TypedPtr resident() const override { return {}; }
  ShardLoan lend(std::uint64_t b, std::uint64_t e) override;
  void write(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) override;
  AioEngine::Ticket write_async(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) override;
  void wait(AioEngine::Ticket& ticket) override { engine_.wait(ticket); }

  // The file's bytes for `elements` of `dtype`.
  static std::uint64_t file_bytes(std::uint64_t elements, DType dtype);
  // Bytes of the host buffer a loan of [b, e) takes (the pages holding it)
  // in a shard starting at `begin`.
  static std::uint64_t loan_bytes(std::uint64_t begin, std::uint64_t b, std::uint64_t e,
                                  DType dtype);

 private:
  Device& device_;
  AioEngine engine_;
  int file_ = -1;
  std::uint64_t file_bytes_ = 0;
};

}  // namespace ztrain::shard
