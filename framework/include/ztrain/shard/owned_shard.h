// OwnedShard: where a rank's owned range of the working parameters lives.
//
// A ZeRO rank owns the flat elements [begin, end) of the working parameters
// (in the run's precision). The gatherer reads them to send its part of
// each all-gather, the optimizer writes them after each step, and import
// and initialisation set them. In memory (ResidentShard: the device or the
// host tier) the readers see the elements in place; in a swap file on the
// NVMe tier (SwappedShard) they are read into a host buffer first. The
// interface is the same either way, so the gatherer and the optimizer do
// not know where the shard lives.
//
// Ownership: a loan owns its staging buffer, if any; the data it points to
// stays valid while the loan lives. ResidentShard is a view: it does not
// own the memory it was made over, which must outlive it.
// Errors: IoError from a swapped shard's transfers; InternalError for a
// range outside the shard.
// Thread safety: the training thread only.
#pragma once

#include <cstdint>

#include "ztrain/device.h"
#include "ztrain/export.h"
#include "ztrain/kernels.h"
#include "ztrain/shard/aio.h"

namespace ztrain::shard {

// Owned elements lent for reading.
struct ShardLoan {
  Buffer staging;      // the host buffer they were read into; empty when lent in place
  ConstTypedPtr data;  // the first element asked for
};

class ZTRAIN_API OwnedShard {
 public:
  OwnedShard(std::uint64_t begin, std::uint64_t end, DType dtype)
      : begin_(begin), end_(end), dtype_(dtype) {}
  virtual ~OwnedShard();
  OwnedShard(const OwnedShard&) = delete;
  OwnedShard& operator=(const OwnedShard&) = delete;

  std::uint64_t begin() const { return begin_; }
  std::uint64_t end() const { return end_; }
  DType dtype() const { return dtype_; }
  virtual Tier tier() const = 0;
  // The whole range in memory (element 0 is flat element begin()), or a null
  // pointer when it lives in a file.
  virtual TypedPtr resident() const = 0;
  // Flat elements [b, e) of the range, for reading (b == e lends nothing).
  virtual ShardLoan lend(std::uint64_t b, std::uint64_t e) = 0;
  // Sets flat elements [b, b + n) from `src`, in the shard's type; done when
  // it returns.
  virtual void write(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) = 0;
  // The same, possibly still under way when it returns: `src` must stay
  // unchanged until wait() on the ticket returned. For a swapped shard, b
  // must start a page of the file and b + n end one or the range, and src
  // must be page-aligned with room up to the page's end.
  virtual AioEngine::Ticket write_async(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) = 0;
  virtual void wait(AioEngine::Ticket& ticket) = 0;

 protected:
  void check(std::uint64_t b, std::uint64_t e) const;

 private:
  std::uint64_t begin_, end_;
  DType dtype_;
};

// The range in memory of `tier` of `device`, at `data` (written through
// the device: the host may not reach it).
class ZTRAIN_API ResidentShard final : public OwnedShard {
 public:
  ResidentShard(Device& device, std::uint64_t begin, std::uint64_t end, TypedPtr data, Tier tier)
      : OwnedShard(begin, end, data.dtype), device_(device), data_(data), tier_(tier) {}
  Tier tier() const override { return tier_; }
  TypedPtr resident() const override { return data_; }
  ShardLoan lend(std::uint64_t b, std::uint64_t e) override;
  void write(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) override;
  AioEngine::Ticket write_async(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) override {
    write(b, src, n);
    return {};
  }
  void wait(AioEngine::Ticket&) override {}

 private:
  Device& device_;
  TypedPtr data_;
  Tier tier_;
};

}  // namespace ztrain::shard
