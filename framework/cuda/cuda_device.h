// CudaDevice: one GPU as a ztrain Device (see cuda_backend.h), with what
// the kernels, the NCCL communicator and the offload copies need beyond
// the SDK interface: its three streams, ordering between them, and
// asynchronous copies.
//
// Streams: `compute` runs every kernel; `comm` runs collectives; `copy`
// runs transfers between the tiers. Work on different streams is ordered
// only by order(after, before), which makes `after` wait (on the GPU, the
// host does not block) for everything queued on `before` so far.
//
// The rule that makes released blocks safe to hand out at once (see
// caching_allocator.h): work on `comm` or `copy` that touches device
// memory starts with order(that stream, compute) and is followed, before
// the memory is released, by order(compute, that stream) (for collectives,
// CommWork::wait() does it). Zero fills run on `compute`.
//
// Ownership: buffers must be released before the device is destroyed.
// Thread safety: allocation and statistics from any thread (each call
// makes this GPU its thread's current device); stream work from the
// thread that drives the device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/caching_allocator.h"
#include "cuda/cuda_backend.h"
#include "ztrain/device.h"

namespace ztrain::cuda {

class ZTRAIN_API CudaDevice final : public Device, private DeviceMemory {
 public:
  explicit CudaDevice(const CudaOptions& options);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  int threads() const override { return options_.host_threads; }

  // Device interface: copies on the compute stream (waited for when host
  // memory is at either end), zero fills there too.
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void copy_rows(const RowCopy& c) override;
  void convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) override;
  void accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n) override;
  void fill_zero(void* p, std::size_t bytes) override;
  // On the copy stream after the compute stream's work so far; the work's
  // wait() blocks on the copy's event, then orders compute after it.
  CopyWork copy_async(void* dst, const void* src, std::size_t bytes) override;
  bool host_visible(Tier tier) const override { return tier != Tier::device; }

  // Whether p is GPU memory (else host memory, pinned or not).
  static bool on_gpu(const void* p);
  int ordinal() const { return options_.ordinal; }
  const cudaDeviceProp& properties() const { return props_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cudaStream_t copy() const { return copy_; }

  // `after` waits for the work queued on `before` so far.
  void order(cudaStream_t after, cudaStream_t before);
  // bytes from src to dst on `stream` (any tiers; pinned host memory makes
  // it asynchronous to the host).
  void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
  // Waits for every stream.
  void synchronize();
  AllocatorStats allocator_stats() const { return cache_.stats(); }

 protected:
  void* raw_allocate(Tier tier, Category category, std::size_t bytes, Fill fill) override;
  void raw_free(Tier tier, Category category, void* p, std::size_t bytes) noexcept override;

 private:
  // DeviceMemory, for the caching allocator.
  void* device_alloc(std::size_t bytes) override;
  void device_free(void* p) override;
  void drain() override;
  // Makes this GPU the calling thread's current device.
  void bind() const;

  void* allocate_device(std::size_t bytes, Fill fill);
  // Pinned when asked, except checkpoint snapshots: the host writes those
  // to disk and never hands them to the GPU, and pinning tens of GB at
  // once stalls the system.
  bool pinned(Category category) const {
    return options_.pin_memory && category != Category::checkpoint;
  }
  void* allocate_host(std::size_t bytes, bool pin, Fill fill);

  CudaOptions options_;
  cudaDeviceProp props_{};
  std::string name_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr, copy_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  CachingAllocator cache_{*this};
};

}  // namespace ztrain::cuda
