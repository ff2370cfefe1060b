// The CUDA backend's caching allocator policy, on the CPU: a fake device
// that can be capped and counts what it was asked.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>

#include "cuda/caching_allocator.h"

namespace {

using ztrain::cuda::CachingAllocator;

class FakeDevice final : public ztrain::cuda::DeviceMemory {
 public:
  std::size_t capacity = SIZE_MAX;  // bytes the device will hand out
  std::size_t held = 0;
  int allocs = 0, frees = 0, drains = 0;
  // Frees while work may be in flight: a device_free not preceded by a
  // drain since the last allocation.
  int unsafe_frees = 0;

  void* device_alloc(std::size_t bytes) override {
    if (held + bytes > capacity) return nullptr;
    held += bytes;
    ++allocs;
    drained_ = false;
    sizes_[p_ += 1 << 20] = bytes;  // fake, distinct addresses
    return reinterpret_cast<void*>(p_);
  }
  void device_free(void* p) override {
    const auto it = sizes_.find(reinterpret_cast<std::uintptr_t>(p));
    REQUIRE(it != sizes_.end());
    held -= it->second;
    sizes_.erase(it);
    ++frees;
    if (!drained_) ++unsafe_frees;
  }
  void drain() override {
    ++drains;
    drained_ = true;
  }

 private:
  bool drained_ = false;
  std::uintptr_t p_ = 0;
  std::map<std::uintptr_t, std::size_t> sizes_;
};

}  // namespace

TEST_CASE("size classes: 512-byte steps to 1 MiB, then at most 12.5 % rounding") {
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(512) == 512);
  CHECK(CachingAllocator::size_class(513) == 1024);
  CHECK(CachingAllocator::size_class(1 << 20) == 1 << 20);
  CHECK(CachingAllocator::size_class((1 << 20) + 1) == (1 << 20) + (1 << 17));
  for (std::size_t b : {std::size_t{1} << 21, (std::size_t{3} << 20) + 7, std::size_t{123456789},
                        (std::size_t{1} << 33) - 1}) {
    const std::size_t c = CachingAllocator::size_class(b);
    CHECK(c >= b);
    CHECK(static_cast<double>(c - b) <= 0.125 * static_cast<double>(b));
    CHECK(CachingAllocator::size_class(c) == c);  // a class is its own class
  }
}

TEST_CASE("a released block is handed out again for its class, without the device") {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* p = a.allocate(1000, std::nullopt);
  a.release(p);
  void* q = a.allocate(900, std::nullopt);  // same class (1024)
  CHECK(q == p);
  void* r = a.allocate(5000, std::nullopt);  // another class: a new block
  CHECK(r != p);
  CHECK(dev.allocs == 2);
  CHECK(a.stats().hits == 1);
  CHECK(a.stats().misses == 2);
  CHECK(dev.drains == 0);  // no waiting on the hot path
  a.release(q);
  a.release(r);
  CHECK(a.stats().cached == 1024 + 5120);
  a.release_all();
  CHECK(dev.held == 0);
  CHECK(dev.unsafe_frees == 0);
}

TEST_CASE("at the limit cached blocks of other classes go back to the device, after a drain") {
  FakeDevice dev;
  CachingAllocator a(dev);
  const std::uint64_t limit = 8192;
  void* small = a.allocate(1024, limit);
  void* mid = a.allocate(4096, limit);
  a.release(small);
  a.release(mid);
  CHECK(a.stats().cached == 5120);
  // 6144 does not fit beside 5120 cached under 8192: the 4096 block goes
  // (largest first), the 1024 one stays.
  void* big = a.allocate(6144, limit);
  REQUIRE(big != nullptr);
  CHECK(a.stats().reserved == 7168);
  CHECK(a.stats().cached == 1024);
  CHECK(a.stats().trims == 1);
  CHECK(dev.unsafe_frees == 0);
  // Nothing can make 8192 fit beside 6144 in use.
  CHECK(a.allocate(8192, limit) == nullptr);
  CHECK(a.stats().reserved <= limit);
  a.release(big);
  a.release_all();
  CHECK(dev.held == 0);
}

TEST_CASE("a device that refuses below the limit gets every cached block back first") {
  FakeDevice dev;
  dev.capacity = 8192;
  CachingAllocator a(dev);
  void* p = a.allocate(4096, std::nullopt);
  void* q = a.allocate(2048, std::nullopt);
  a.release(p);
  a.release(q);
  void* big = a.allocate(8192, std::nullopt);
  REQUIRE(big != nullptr);
  CHECK(dev.frees == 2);
  CHECK(dev.unsafe_frees == 0);
  CHECK(a.allocate(512, std::nullopt) == nullptr);  // the device is full
  a.release(big);
  a.release_all();
  CHECK(dev.held == 0);
}

TEST_CASE("the peak counts what was held from the device, rounding included") {
  FakeDevice dev;
  CachingAllocator a(dev);
  void* p = a.allocate(3 << 20, std::nullopt);
  void* q = a.allocate(100, std::nullopt);
  CHECK(a.stats().peak_reserved == (3u << 20) + 512);
  a.release(p);
  a.release(q);
  a.release_all();
  CHECK(a.stats().reserved == 0);
  CHECK(a.stats().peak_reserved == (3u << 20) + 512);
}
