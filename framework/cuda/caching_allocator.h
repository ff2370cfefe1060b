// CachingAllocator: device memory handed out again by size class, so the
// allocations a training step repeats every step stop reaching cudaMalloc
// (which synchronises the device and costs tens of microseconds).
//
// Sizes are rounded to a class: multiples of 512 bytes up to 1 MiB, then
// eight classes per power of two (at most 12.5 % rounding). A freed block
// keeps its class and is marked with a point in the device's work queue
// (a CUDA event on the compute stream): it is handed out again only once
// the device has passed that point, so work still queued on the old
// owner's behalf can never see a new owner's data, whichever stream the new
// owner uses.
//
// `limit` caps what the allocator holds from the device (in use plus
// cached), which is how a memory budget below the card's memory makes a
// small GPU out of a large one: a request that would pass it first waits
// for the device and reuses a block of its class, then returns cached
// blocks of other classes to the device, and only then fails. A device
// that refuses an allocation below the limit gets the same treatment
// before the request fails.
//
// The device side is an interface (DeviceMemory) so the policy is tested
// on the CPU (tests/unit/test_caching_allocator.cpp).
// Thread safety: every method may be called from any thread.
// Errors: allocate returns nullptr when nothing frees enough room; the
// caller (the cuda device) raises OutOfMemoryError with its figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace ztrain::cuda {

// What the allocator asks of the device. A Mark is an opaque point in the
// device's queue of work (0 = none).
class DeviceMemory {
 public:
  using Mark = std::uintptr_t;
  virtual ~DeviceMemory() = default;
  // nullptr when the device has no room.
  virtual void* device_alloc(std::size_t bytes) = 0;
  virtual void device_free(void* p) = 0;
  // A point after all work queued so far.
  virtual Mark mark() = 0;
  // Whether the device has passed `m`.
  virtual bool passed(Mark m) = 0;
  // The mark is no longer needed.
  virtual void forget(Mark m) = 0;
  // Waits until the device has passed every mark.
  virtual void drain() = 0;
};

struct AllocatorStats {
  std::uint64_t reserved = 0;       // held from the device: in use + cached
  std::uint64_t cached = 0;         // held, free for reuse
  std::uint64_t peak_reserved = 0;  // largest `reserved` seen
  std::uint64_t hits = 0;           // requests served from the cache
  std::uint64_t misses = 0;         // requests that reached the device
  std::uint64_t trims = 0;          // blocks returned to the device to make room
  std::uint64_t drains = 0;         // waits for the device to reuse a block
};

class CachingAllocator {
 public:
  explicit CachingAllocator(DeviceMemory& device) : device_(device) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  // The owner calls release_all() while its device still works.
  ~CachingAllocator() = default;

  // The size class `bytes` is rounded to.
  static std::size_t size_class(std::size_t bytes);

  // A block of at least `bytes` (> 0), or nullptr when the device cannot
  // give it within `limit` (see above).
  void* allocate(std::size_t bytes, std::optional<std::uint64_t> limit);
  // Returns a block from allocate() to the cache.
  void release(void* p);
  // Returns every cached block whose reuse point has passed to the device.
  void trim();
  // Waits for the device and returns every cached block (blocks still in
  // use are the caller's to release first).
  void release_all();
  AllocatorStats stats() const;

 private:
  struct Cached {
    void* p;
    DeviceMemory::Mark mark;
  };
  void* reuse(std::size_t cls, bool wait);
  void make_room(std::uint64_t need, std::optional<std::uint64_t> limit, bool refused);
  void* from_device(std::size_t cls);
  void free_cached(Cached c, std::size_t cls);

  DeviceMemory& device_;
  mutable std::mutex mu_;
  // Free blocks per class, oldest first (the first to pass its mark).
  std::map<std::size_t, std::vector<Cached>> cache_;
  std::unordered_map<void*, std::size_t> in_use_;
  AllocatorStats stats_;
};

}  // namespace ztrain::cuda
