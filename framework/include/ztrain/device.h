// Devices, memory tiers and allocation accounting.
//
// A Device hands out Buffers in three tiers: `device` (the accelerator's
// memory; RAM on the cpu device), `host` (RAM, pinned when the device is
// cuda) and `nvme` (files, accounted here but created by the shard
// toolkit's NVMe stores through shard/aio.h). Every allocation names a Category so the trainer
// can report current and peak bytes per tier and category. A tier may carry a
// budget; an allocation beyond it raises OutOfMemoryError naming the tier,
// category, request, use and peak, as a GPU would. On the cpu device this
// budget is what makes offloading observable without a GPU.
//
// Ownership: a Buffer owns its bytes and returns them on destruction; the
// Device must outlive every Buffer it handed out.
// Alignment: 64 bytes, 4096 from 4096 bytes up on the cpu device (direct
// I/O reads into host tiers); 256 on the cuda device tier.
// Thread safety: allocate/release/stats may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ztrain/export.h"
#include "ztrain/ids.h"
#include "ztrain/tensor.h"

namespace ztrain {

enum class Tier : std::uint8_t { device, host, nvme };
// checkpoint: the copy of the optimizer state a checkpoint is written from
// while training goes on.
enum class Category : std::uint8_t {
  params,
  grads,
  optimizer,
  activations,
  comm,
  offload,
  checkpoint
};
inline constexpr std::size_t kTierCount = 3;
inline constexpr std::size_t kCategoryCount = 7;
// Every tier and every category, in order, for loops over them.
inline constexpr Tier kTiers[kTierCount] = {Tier::device, Tier::host, Tier::nvme};
inline constexpr Category kCategories[kCategoryCount] = {
    Category::params, Category::grads,   Category::optimizer, Category::activations,
    Category::comm,   Category::offload, Category::checkpoint};

template <class T>
using PerTier = IdArray<Tier, kTierCount, T>;
template <class T>
using PerCategory = IdArray<Category, kCategoryCount, T>;
// Bytes by tier and category: the one shape of what a strategy estimates
// (MemoryEstimate::bytes) and what a device measures (MemoryStats).
using TierTable = PerTier<PerCategory<std::uint64_t>>;

ZTRAIN_API std::string_view tier_name(Tier t);
ZTRAIN_API std::string_view category_name(Category c);

enum class DeviceKind : std::uint8_t { cpu, cuda };

// What a new allocation holds: zeros, or whatever was there (for buffers
// written before they are read, such as activations).
enum class Fill : std::uint8_t { zeros, undefined };

// What a device has allocated: by tier and category now and at its peak,
// and by tier (what was in use at once, not the sum of the categories'
// peaks).
// A 2-D copy: `rows` runs of `width` bytes, each run `src_pitch` bytes
// after the one before at the source and `dst_pitch` at the destination
// (heads taken out of interleaved token rows, or put back).
struct RowCopy {
  void* dst;
  std::size_t dst_pitch;
  const void* src;
  std::size_t src_pitch;
  std::size_t width, rows;
};

struct MemoryStats {
  TierTable current, peak;
  PerTier<std::uint64_t> tier_current, tier_peak;
};

class Device;

// A copy the device runs on its own (Device::copy_async). Default-
// constructed: already complete. Its source and destination must stay
// allocated, and the destination untouched, until wait() returns; the
// destructor waits too (an error there is dropped: the copy has failed
// either way, and the memory must outlive it), so declare a CopyWork after
// the buffers it copies.
// Thread safety: one thread at a time.
class ZTRAIN_API CopyWork {
 public:
  CopyWork() = default;
  // A device's pending copy: `wait` blocks until it is done and orders the
  // device's later kernels after it; `done` asks without waiting.
  CopyWork(std::function<void()> wait, std::function<bool()> done)
      : wait_(std::move(wait)), done_(std::move(done)) {}
  CopyWork(CopyWork&& other) noexcept
      : wait_(std::exchange(other.wait_, nullptr)), done_(std::exchange(other.done_, nullptr)) {}
  CopyWork& operator=(CopyWork&& other) noexcept;
  CopyWork(const CopyWork&) = delete;
  CopyWork& operator=(const CopyWork&) = delete;
  ~CopyWork();
  // Returns when the copy is done for the host and for the device's later
  // work; later calls return at once. Errors: the device's.
  void wait();
  // True when wait() would return at once.
  bool done() const { return !wait_ || done_(); }

 private:
  std::function<void()> wait_;
  std::function<bool()> done_;
};

class ZTRAIN_API Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  Tier tier() const { return tier_; }
  Category category() const { return category_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset();

 private:
  friend class Device;
  Device* device_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Tier tier_ = Tier::device;
  Category category_ = Category::params;
};

class ZTRAIN_API Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;
  // Worker threads used by the kernels on this device.
  virtual int threads() const = 0;

  // 64-byte aligned, 4096-byte aligned from 4096 bytes up (direct I/O),
  // zero-filled unless asked otherwise. Tier nvme is not allocatable here
  // (its files are the NVMe stores'; account() counts them); bytes == 0
  // gives an empty Buffer.
  Buffer allocate(Tier tier, Category category, std::size_t bytes, Fill fill = Fill::zeros);

  // Accounts bytes held elsewhere (nvme files): positive to add, negative to
  // return. Raises OutOfMemoryError past the tier's budget.
  void account(Tier tier, Category category, std::int64_t bytes);

  // Moving bytes, for code that must not assume the host can touch a tier
  // (host_visible). dst and src are this device's memory (any tier) or
  // plain host memory. A copy with host memory at either end has finished
  // when it returns; one between device-tier blocks, and fill_zero, are
  // ordered with the device's kernels. On the cpu device every tier is
  // host memory: memcpy and memset.
  virtual void copy(void* dst, const void* src, std::size_t bytes);
  // n values from src into dst's type (rounded as dtype.h; the same type
  // copies), with the same reach and ordering as copy().
  virtual void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n);
  // dst (n) += src (n), both of one type, each sum in fp32 rounded once (a
  // reduced gradient landing in the shard that accumulates it), with the
  // same reach and ordering as copy(). InternalError for two types.
  virtual void accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n);
  virtual void fill_zero(void* p, std::size_t bytes);
  // copy() of every run of a RowCopy (the runs do not overlap), with the
  // same reach and ordering.
  virtual void copy_rows(const RowCopy& c);
  // A copy with the reach of copy() that may still be running when it
  // returns, ordered after the kernels queued so far: a GPU runs it on its
  // copy stream beside the kernels (gradients going down to host memory,
  // updated parameters coming up), so transfers overlap compute. The cpu
  // device copies at once and returns a finished work.
  virtual CopyWork copy_async(void* dst, const void* src, std::size_t bytes);
  // Whether host code may read and write this tier's memory directly
  // (cpu: every tier; cuda: host).
  virtual bool host_visible(Tier tier) const;

  void set_budget(Tier tier, std::optional<std::uint64_t> bytes);
  std::optional<std::uint64_t> budget(Tier tier) const;
  MemoryStats stats() const;
  void reset_peaks();

 protected:
  Device() = default;
  // The category lets a device place blocks by use (the cuda device pins
  // host blocks for transfers, not checkpoint snapshots the host writes).
  virtual void* raw_allocate(Tier tier, Category category, std::size_t bytes, Fill fill) = 0;
  virtual void raw_free(Tier tier, Category category, void* p, std::size_t bytes) noexcept = 0;

 private:
  friend class Buffer;
  void reserve(Tier tier, Category category, std::uint64_t bytes);
  void release(Tier tier, Category category, std::uint64_t bytes) noexcept;

  mutable std::mutex mu_;
  MemoryStats stats_;
  PerTier<std::optional<std::uint64_t>> budget_;
};

// The cpu device: all tiers are RAM; `threads` workers (0 = all cores) run
// the kernels through oneTBB and OpenBLAS.
ZTRAIN_API std::unique_ptr<Device> make_cpu_device(int threads);

}  // namespace ztrain
