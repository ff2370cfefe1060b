// CachingAllocator: device memory handed out again by size class, so the
// allocations a training step repeats every step stop reaching cudaMalloc
// (which synchronises the device and costs tens of microseconds).
//
// Sizes are rounded to a class: multiples of 512 bytes up to 1 MiB, then
// eight classes per power of two (at most 12.5 % rounding). A released
// block is handed out again at once, as PyTorch's allocator does for its
// stream: every kernel runs on the compute stream, so work queued for the
// block's next owner runs after the work queued for its last one. Work on
// another stream keeps that true by ordering itself between compute-stream
// work on both sides (cuda_device.h says how).
//
// `limit` caps what the allocator holds from the device (in use plus
// cached), which is how a memory budget below the card's memory makes a
// small GPU out of a large one: a request that would pass it waits for the
// device and returns cached blocks of other classes first, and only then
// fails. A device that refuses an allocation below the limit gets the same
// treatment before the request fails.
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

#include "ztrain/export.h"

namespace ztrain::cuda {

// What the allocator asks of the device.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // nullptr when the device has no room.
  virtual void* device_alloc(std::size_t bytes) = 0;
  virtual void device_free(void* p) = 0;
  // Waits until the device has finished all work queued so far (before
  // blocks that work may still use go back to the device).
  virtual void drain() = 0;
};

struct AllocatorStats {
  std::uint64_t reserved = 0;       // held from the device: in use + cached
  std::uint64_t cached = 0;         // held, free for reuse
  std::uint64_t peak_reserved = 0;  // largest `reserved` seen
  std::uint64_t hits = 0;           // requests served from the cache
  std::uint64_t misses = 0;         // requests that reached the device
  std::uint64_t trims = 0;          // blocks returned to the device to make room
};

class ZTRAIN_API CachingAllocator {
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
  // Waits for the device and returns every cached block (blocks still in
  // use are the caller's to release first).
  void release_all();
  AllocatorStats stats() const;

 private:
  void* reuse(std::size_t cls);
  void make_room(std::uint64_t need, std::optional<std::uint64_t> limit, bool refused);
  void* from_device(std::size_t cls);
  void free_cached(void* p, std::size_t cls);

  DeviceMemory& device_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> cache_;  // free blocks per class
  std::unordered_map<void*, std::size_t> in_use_;
  AllocatorStats stats_;
};

}  // namespace ztrain::cuda
