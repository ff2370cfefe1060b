// The cpu device: every tier is RAM; kernels run on `threads` workers shared
// by oneTBB (elementwise and attention loops) and OpenBLAS (GEMMs). The two
// never run at once (a GEMM is called from the training thread, outside any
// TBB loop), so both are given the full thread count.
#include <cblas.h>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

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
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    if (void* cached = take_cached(rounded)) {
      if (fill == Fill::zeros) std::memset(cached, 0, rounded);
      return cached;
    }
    void* p = std::aligned_alloc(64, rounded);
    if (!p && drop_cache()) p = std::aligned_alloc(64, rounded);
    if (!p)
      throw OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes) +
                             " on tier '" + std::string(tier_name(tier)) +
                             "'; free memory or lower the run's footprint");
    if (fill == Fill::zeros) std::memset(p, 0, rounded);
    return p;
  }
  void raw_free(Tier, void* p, std::size_t bytes) noexcept override {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    {
      std::lock_guard lock(cache_mu_);
      if (rounded >= kCacheMin && cached_bytes_ + rounded <= kCacheMax) {
        try {
          cache_[rounded].push_back(p);
          cached_bytes_ += rounded;
          return;
        } catch (...) {  // no room to remember it: give it back instead
        }
      }
    }
    std::free(p);
  }

 public:
  ~CpuDevice() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
  }

 private:
  // Freed blocks of at least kCacheMin bytes are kept, by exact size, up to
  // kCacheMax in all, and handed out again: zero3 gathers and releases the
  // same parameter sizes every step, and fresh pages (malloc returns large
  // blocks to the system) cost more than the zeroing. The accounting is
  // logical, as a GPU caching allocator's: cached blocks count as free.
  static constexpr std::size_t kCacheMin = 64 << 10;
  static constexpr std::size_t kCacheMax = std::size_t{256} << 20;
  // Returns the cached blocks to the system; true when there were any.
  bool drop_cache() {
    std::lock_guard lock(cache_mu_);
    if (cached_bytes_ == 0) return false;
    for (auto& [size, blocks] : cache_) {
      for (void* p : blocks) std::free(p);
      blocks.clear();
    }
    cached_bytes_ = 0;
    return true;
  }
  void* take_cached(std::size_t rounded) {
    if (rounded < kCacheMin) return nullptr;
    std::lock_guard lock(cache_mu_);
    auto it = cache_.find(rounded);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= rounded;
    return p;
  }

  int threads_;
  std::mutex cache_mu_;
  std::unordered_map<std::size_t, std::vector<void*>> cache_;
  std::size_t cached_bytes_ = 0;
  oneapi::tbb::global_control tbb_limit_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

}  // namespace ztrain
