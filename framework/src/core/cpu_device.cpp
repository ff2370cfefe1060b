// The cpu device: every tier is RAM; kernels run on `threads` workers shared
// by oneTBB (elementwise and attention loops) and OpenBLAS (GEMMs). The two
// never run at once (a GEMM is called from the training thread, outside any
// TBB loop), so both are given the full thread count. Memory comes from the
// process allocator, which in the ztrain executable is jemalloc keeping
// what is freed for reuse (framework/app/malloc_conf.cpp): the accounting
// is logical, as a GPU caching allocator's.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include <oneapi/tbb/parallel_for.h>

#include "core/host_threads.h"
#include "kernels/cpu/vector_math.h"
#include "ztrain/device.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

// Large buffers start at staggered offsets ("colours"). jemalloc hands out
// blocks of this size on 2 MiB boundaries, so the arrays a loop streams
// together (AdamW's masters, gradients, m and v) would share their address
// bits up to bit 21 and contend for the same cache sets and memory banks:
// bench_adamw over 1e8 elements ran at 1.29 ns/element with the arrays
// aligned alike and 0.72-0.85 with them 64 KiB apart (a standalone loop:
// 0.80 at 4 KiB apart, 0.71 at 64 KiB). A block of kColourFrom bytes or
// more is placed so that address bits 16-18 hold the next colour of
// kColours, whatever the allocator returned: 1 to kColours steps of
// kColourStep into a larger allocation, whose start is kept in the 8 bytes
// before the block. Colours follow allocation order, so arrays allocated
// one after another (as a shard's state is) differ. The cost is at most
// 512 KiB more per block from the allocator (which may round it up to its
// next size class), mostly never touched, and outside the device's
// accounting, as any allocator's rounding is.
constexpr std::size_t kColourFrom = std::size_t{4} << 20;
constexpr std::size_t kColourStep = std::size_t{64} << 10;
constexpr std::size_t kColours = 8;

bool coloured(std::size_t bytes) {
  return bytes >= kColourFrom;
}

// Steps of kColourStep from `base` to the next address of colour `c`, 1 to
// kColours (never 0: the header needs room).
std::size_t colour_steps(const std::byte* base, std::size_t c) {
  const std::size_t at = reinterpret_cast<std::uintptr_t>(base) / kColourStep;
  const std::size_t steps = (c + kColours - at % kColours) % kColours;
  return steps == 0 ? kColours : steps;
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads) : threads_(threads) {}

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override {
    return "cpu (" + std::to_string(threads_.count()) + " threads)";
  }
  int threads() const override { return threads_.count(); }
  void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) override;

 protected:
  void* raw_allocate(Tier tier, Category, std::size_t bytes, Fill fill) override {
    const auto refused = [&] {
      return OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes) +
                              " on tier '" + std::string(tier_name(tier)) +
                              "'; free memory or lower the run's footprint");
    };
    // Page-aligned from a page up, as direct I/O (the NVMe tier) needs.
    const std::size_t align = bytes >= 4096 ? 4096 : 64;
    const std::size_t padding = coloured(bytes) ? kColours * kColourStep : 0;
    if (bytes > SIZE_MAX - padding - align) throw refused();  // the sums below would wrap
    const std::size_t rounded = (bytes + align - 1) / align * align;
    auto* base = static_cast<std::byte*>(std::aligned_alloc(align, rounded + padding));
    if (!base) throw refused();
    std::byte* p = base;
    if (padding) {
      // Transparent huge pages where the system gives them on request
      // (THP "madvise"): fewer TLB misses for the loops that stream these
      // blocks; bench_adamw over 1e8 elements went from 0.571 to 0.536
      // ns/element, the stream loop from 0.565 to 0.537. Advice only: a
      // system without THP ignores it.
      ::madvise(base, rounded + padding, MADV_HUGEPAGE);
      p += colour_steps(base, colour_.fetch_add(1, std::memory_order_relaxed)) * kColourStep;
      std::memcpy(p - sizeof base, &base, sizeof base);
    }
    if (fill == Fill::zeros) std::memset(p, 0, rounded);
    return p;
  }
  void raw_free(Tier, Category, void* p, std::size_t bytes) noexcept override {
    if (!coloured(bytes)) return std::free(p);
    std::byte* base;
    std::memcpy(&base, static_cast<std::byte*>(p) - sizeof base, sizeof base);
    std::free(base);
  }

 private:
  HostThreads threads_;
  std::atomic<std::size_t> colour_{0};
};

// Activations kept in a 16-bit type go through here twice a tensor (kept,
// then restored for backward): in blocks over the workers, with the
// vector conversions, which round as dtype.h does, so the bits do not
// depend on the thread count.
void CpuDevice::convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) {
  const bool widen = dst.dtype == DType::f32 && src.dtype != DType::f32;
  const bool narrow = src.dtype == DType::f32 && dst.dtype != DType::f32;
  if (!widen && !narrow) return Device::convert(dst, src, n);
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  oneapi::tbb::parallel_for(std::size_t{0}, (n + kBlock - 1) / kBlock, [&](std::size_t blk) {
    const std::size_t i = blk * kBlock, m = std::min(n, i + kBlock) - i;
    if (widen)
      vec::to_f32(src.at(i), static_cast<float*>(dst.data) + i, m);
    else
      vec::from_f32(static_cast<const float*>(src.data) + i, dst.at(i), m);
  });
}

}  // namespace

std::unique_ptr<Device> make_cpu_device(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

}  // namespace ztrain
