// The cpu device: every tier is RAM; kernels run on `threads` workers shared
// by oneTBB (elementwise and attention loops) and OpenBLAS (GEMMs). The two
// never run at once (a GEMM is called from the training thread, outside any
// TBB loop), so both are given the full thread count. Memory comes from the
// process allocator, which in the ztrain executable is jemalloc keeping
// what is freed for reuse (framework/app/malloc_conf.cpp): the accounting
// is logical, as a GPU caching allocator's.
#include <cblas.h>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ztrain/device.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads)
      : threads_(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency())),
        tbb_limit_(oneapi::tbb::global_control::max_allowed_parallelism,
                   static_cast<std::size_t>(threads_)) {
    openblas_set_num_threads(threads_);
  }

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu (" + std::to_string(threads_) + " threads)"; }
  int threads() const override { return threads_; }

 protected:
  void* raw_allocate(Tier tier, std::size_t bytes, Fill fill) override {
    // Page-aligned from a page up, as direct I/O (the NVMe tier) needs.
    const std::size_t align = bytes >= 4096 ? 4096 : 64;
    const std::size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p)
      throw OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes) +
                             " on tier '" + std::string(tier_name(tier)) +
                             "'; free memory or lower the run's footprint");
    if (fill == Fill::zeros) std::memset(p, 0, rounded);
    return p;
  }
  void raw_free(Tier, void* p, std::size_t) noexcept override { std::free(p); }

 private:
  int threads_;
  oneapi::tbb::global_control tbb_limit_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

}  // namespace ztrain
