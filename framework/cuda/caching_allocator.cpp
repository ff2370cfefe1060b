// The size-class cache of device blocks (caching_allocator.h). Reuse is
// last-freed-first, the block most likely still in the GPU's L2.
#include "cuda/caching_allocator.h"

#include <bit>

namespace ztrain::cuda {
namespace {

constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kSmallMax = std::size_t{1} << 20;
// Classes per power of two above kSmallMax: 8 keeps rounding under 12.5 %.
constexpr unsigned kClassesPerOctave = 8;

}  // namespace

std::size_t CachingAllocator::size_class(std::size_t bytes) {
  if (bytes <= kSmallMax) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  // The octave's step: 2^(floor(log2 bytes)) / 8.
  const unsigned top = static_cast<unsigned>(std::bit_width(bytes) - 1);
  const std::size_t step = (std::size_t{1} << top) / kClassesPerOctave;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t bytes, std::optional<std::uint64_t> limit) {
  const std::size_t cls = size_class(bytes);
  std::lock_guard lock(mu_);
  if (void* p = reuse(cls)) return p;
  const auto fits = [&] { return !limit || stats_.reserved + cls <= *limit; };
  bool refused = false;
  if (fits()) {
    if (void* p = from_device(cls)) return p;
    refused = true;
  }
  // No room: return cached blocks of other classes, once the device has
  // finished the work that may still use them.
  device_.drain();
  make_room(cls, limit, refused);
  if (!fits()) return nullptr;
  return from_device(cls);
}

void CachingAllocator::release(void* p) {
  std::lock_guard lock(mu_);
  const auto it = in_use_.find(p);
  if (it == in_use_.end()) return;
  const std::size_t cls = it->second;
  in_use_.erase(it);
  cache_[cls].push_back(p);
  stats_.cached += cls;
}

void CachingAllocator::release_all() {
  std::lock_guard lock(mu_);
  device_.drain();
  for (auto& [cls, blocks] : cache_) {
    for (void* p : blocks) free_cached(p, cls);
    blocks.clear();
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void* CachingAllocator::reuse(std::size_t cls) {
  const auto it = cache_.find(cls);
  if (it == cache_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  stats_.cached -= cls;
  ++stats_.hits;
  in_use_.emplace(p, cls);
  return p;
}

// Called after drain(). Returns cached blocks, largest first, until `need`
// more bytes fit under the limit, or all of them when the device itself
// refused (its free memory is unknown here).
void CachingAllocator::make_room(std::uint64_t need, std::optional<std::uint64_t> limit,
                                 bool refused) {
  const auto done = [&] { return !refused && (!limit || stats_.reserved + need <= *limit); };
  for (auto it = cache_.rbegin(); it != cache_.rend() && !done(); ++it) {
    auto& blocks = it->second;
    while (!blocks.empty() && !done()) {
      free_cached(blocks.back(), it->first);
      blocks.pop_back();
    }
  }
}

void* CachingAllocator::from_device(std::size_t cls) {
  void* p = device_.device_alloc(cls);
  if (!p) return nullptr;
  ++stats_.misses;
  stats_.reserved += cls;
  if (stats_.reserved > stats_.peak_reserved) stats_.peak_reserved = stats_.reserved;
  in_use_.emplace(p, cls);
  return p;
}

void CachingAllocator::free_cached(void* p, std::size_t cls) {
  device_.device_free(p);
  stats_.cached -= cls;
  stats_.reserved -= cls;
  ++stats_.trims;
}

}  // namespace ztrain::cuda
