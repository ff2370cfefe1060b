#include "ztrain/device.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::device:
      return "device";
    case Tier::host:
      return "host";
    case Tier::nvme:
      return "nvme";
  }
  return "?";
}

std::string_view category_name(Category c) {
  switch (c) {
    case Category::params:
      return "params";
    case Category::grads:
      return "grads";
    case Category::optimizer:
      return "optimizer";
    case Category::activations:
      return "activations";
    case Category::comm:
      return "comm";
    case Category::offload:
      return "offload";
    case Category::checkpoint:
      return "checkpoint";
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    tier_ = other.tier_;
    category_ = other.category_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (data_) {
    device_->raw_free(tier_, category_, data_, bytes_);
    device_->release(tier_, category_, bytes_);
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Buffer Device::allocate(Tier tier, Category category, std::size_t bytes, Fill fill) {
  if (tier == Tier::nvme)
    throw InternalError("Device::allocate: the nvme tier is file-backed (shard/aio.h)");
  Buffer b;
  if (bytes == 0) return b;
  reserve(tier, category, bytes);
  void* p = nullptr;
  try {
    p = raw_allocate(tier, category, bytes, fill);
  } catch (...) {
    release(tier, category, bytes);
    throw;
  }
  b.device_ = this;
  b.data_ = p;
  b.bytes_ = bytes;
  b.tier_ = tier;
  b.category_ = category;
  return b;
}

void Device::account(Tier tier, Category category, std::int64_t bytes) {
  if (bytes >= 0)
    reserve(tier, category, static_cast<std::uint64_t>(bytes));
  else
    release(tier, category, static_cast<std::uint64_t>(-bytes));
}

void Device::reserve(Tier tier, Category category, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  const Tier t = tier;
  const Category c = category;
  const std::uint64_t in_use = stats_.tier_current[t];
  if (budget_[t] && in_use + bytes > *budget_[t]) {
    throw OutOfMemoryError(
        "out of memory on tier '" + std::string(tier_name(tier)) + "' (" + name() +
        "): allocating " + format_bytes(bytes) + " for " + std::string(category_name(category)) +
        " with " + format_bytes(in_use) + " in use of a " + format_bytes(*budget_[t]) +
        " budget (peak " + format_bytes(stats_.tier_peak[t]) + "; in bytes: asked " +
        std::to_string(bytes) + ", in use " + std::to_string(in_use) + ", budget " +
        std::to_string(*budget_[t]) +
        "); raise [device] memory_limit, shorten micro_batch_size or seq_len, enable "
        "activation_checkpointing, or pick a strategy that shards or offloads more");
  }
  stats_.current[t][c] += bytes;
  stats_.tier_current[t] += bytes;
  if (stats_.current[t][c] > stats_.peak[t][c]) stats_.peak[t][c] = stats_.current[t][c];
  if (stats_.tier_current[t] > stats_.tier_peak[t]) stats_.tier_peak[t] = stats_.tier_current[t];
}

void Device::release(Tier tier, Category category, std::uint64_t bytes) noexcept {
  std::lock_guard lock(mu_);
  const Tier t = tier;
  const Category c = category;
  stats_.current[t][c] -= bytes;
  stats_.tier_current[t] -= bytes;
}

void Device::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void Device::copy_rows(const RowCopy& c) {
  auto* dst = static_cast<char*>(c.dst);
  const auto* src = static_cast<const char*>(c.src);
  for (std::size_t r = 0; r < c.rows; ++r)
    std::memcpy(dst + r * c.dst_pitch, src + r * c.src_pitch, c.width);
}

void Device::convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) {
  ztrain::convert(src.data, src.dtype, dst.data, dst.dtype, n);
}

void Device::accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n) {
  if (dst.dtype != src.dtype)
    throw InternalError("accumulate: a " + std::string(dtype_name(src.dtype)) + " buffer into a " +
                        std::string(dtype_name(dst.dtype)) + " one");
  add_into(dst.data, src.data, n, dst.dtype);
}

CopyWork Device::copy_async(void* dst, const void* src, std::size_t bytes) {
  copy(dst, src, bytes);
  return {};
}

void CopyWork::wait() {
  if (!wait_) return;
  const auto wait = std::exchange(wait_, nullptr);
  done_ = nullptr;
  wait();
}

CopyWork::~CopyWork() {
  try {
    wait();
  } catch (...) {  // see the header: the copy failed, the memory outlived it
  }
}

CopyWork& CopyWork::operator=(CopyWork&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (...) {  // as in the destructor
    }
    wait_ = std::exchange(other.wait_, nullptr);
    done_ = std::exchange(other.done_, nullptr);
  }
  return *this;
}

void Device::fill_zero(void* p, std::size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

bool Device::host_visible(Tier) const {
  return true;
}

void Device::set_budget(Tier tier, std::optional<std::uint64_t> bytes) {
  std::lock_guard lock(mu_);
  budget_[tier] = bytes;
}

std::optional<std::uint64_t> Device::budget(Tier tier) const {
  std::lock_guard lock(mu_);
  return budget_[tier];
}

MemoryStats Device::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Device::reset_peaks() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.current;
  stats_.tier_peak = stats_.tier_current;
}

}  // namespace ztrain
