// The cuda device (cuda_device.h): tiers, the caching allocator's device
// side and the streams.
#include "cuda/cuda_device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/kernels/cast.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain::cuda {

void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA error in ") + call + " (" + file + ":" + std::to_string(line) +
              "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLASLt error in ") + call + " (" + file + ":" + std::to_string(line) +
              "): " + cublasLtGetStatusName(s) + ": " + cublasLtGetStatusString(s));
}

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // the error is not sticky; clear it for later calls
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime sees no GPU (check CUDA_VISIBLE_DEVICES)";
  return n;
}

CudaDevice::CudaDevice(const CudaOptions& options) : options_(options) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw Error("[device] kind \"cuda\": no usable GPU: " + why);
  if (options.ordinal < 0 || options.ordinal >= count)
    throw Error("[device] kind \"cuda\": GPU " + std::to_string(options.ordinal) +
                " asked for, but only " + std::to_string(count) +
                " are visible; start one rank per GPU or set CUDA_VISIBLE_DEVICES");
  ZTRAIN_CUDA(cudaSetDevice(options.ordinal));
  ZTRAIN_CUDA(cudaGetDeviceProperties(&props_, options.ordinal));
  name_ = "cuda:" + std::to_string(options.ordinal) + " (" + props_.name + ", " +
          format_bytes(props_.totalGlobalMem) + ", sm_" + std::to_string(props_.major) +
          std::to_string(props_.minor) + ")";
  // Collectives get the higher priority: a step waits on them, and NCCL's
  // kernels should not queue behind a long GEMM.
  int least = 0, greatest = 0;
  ZTRAIN_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ZTRAIN_CUDA(cudaStreamCreateWithPriority(&compute_, cudaStreamNonBlocking, least));
  ZTRAIN_CUDA(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest));
  ZTRAIN_CUDA(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, least));
  ZTRAIN_CUDA(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
}

// A device error (a kernel's illegal access, say) is sticky: every later
// call fails with it. The destructor then frees what it can and says so
// once, instead of throwing out of a destructor.
CudaDevice::~CudaDevice() {
  try {
    cache_.release_all();
  } catch (const Error& e) {
    std::fprintf(stderr, "ztrain: %s: could not return cached GPU memory: %s\n", name_.c_str(),
                 e.what());
  }
  cudaEventDestroy(order_event_);
  cudaStreamDestroy(copy_);
  cudaStreamDestroy(comm_);
  cudaStreamDestroy(compute_);
}

void CudaDevice::order(cudaStream_t after, cudaStream_t before) {
  // A wait takes the event's state when it is issued, so one event serves
  // every ordering in turn.
  ZTRAIN_CUDA(cudaEventRecord(order_event_, before));
  ZTRAIN_CUDA(cudaStreamWaitEvent(after, order_event_, 0));
}

bool CudaDevice::on_gpu(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // plain host memory the runtime never saw
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  bind();
  ZTRAIN_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, compute_));
  if (!on_gpu(dst) || !on_gpu(src)) ZTRAIN_CUDA(cudaStreamSynchronize(compute_));
}

void CudaDevice::copy_rows(const RowCopy& c) {
  if (c.rows == 0 || c.width == 0) return;
  bind();
  ZTRAIN_CUDA(cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.rows,
                                cudaMemcpyDefault, compute_));
  if (!on_gpu(c.dst) || !on_gpu(c.src)) ZTRAIN_CUDA(cudaStreamSynchronize(compute_));
}

// A conversion runs where its source is: on the GPU into a scratch block of
// the destination's type (then copied), or on the host into a vector of it
// (then copied); host to host waits for the GPU's copies first.
void CudaDevice::convert(TypedPtr dst, ConstTypedPtr src, std::size_t n) {
  if (n == 0) return;
  if (dst.dtype == src.dtype) return copy(dst.data, src.data, n * dtype_size(dst.dtype));
  const bool src_gpu = on_gpu(src.data), dst_gpu = on_gpu(dst.data);
  bind();
  if (src_gpu && dst_gpu) return launch_cast(dst, src, n, compute_);
  if (src_gpu) {
    Buffer staged =
        allocate(Tier::device, Category::comm, n * dtype_size(dst.dtype), Fill::undefined);
    launch_cast({staged.data(), dst.dtype}, src, n, compute_);
    return copy(dst.data, staged.data(), n * dtype_size(dst.dtype));
  }
  if (dst_gpu) {
    std::vector<std::uint8_t> staged(n * dtype_size(dst.dtype));
    ztrain::convert(src.data, src.dtype, staged.data(), dst.dtype, n);
    return copy(dst.data, staged.data(), staged.size());
  }
  synchronize();
  ztrain::convert(src.data, src.dtype, dst.data, dst.dtype, n);
}

// Where the destination is: on the GPU (a host source is copied up
// first), or on the host (a GPU source is copied down first).
void CudaDevice::accumulate(TypedPtr dst, ConstTypedPtr src, std::size_t n) {
  if (dst.dtype != src.dtype)
    throw InternalError("accumulate: a " + std::string(dtype_name(src.dtype)) + " buffer into a " +
                        std::string(dtype_name(dst.dtype)) + " one");
  if (n == 0) return;
  const std::size_t bytes = n * dtype_size(dst.dtype);
  bind();
  if (on_gpu(dst.data)) {
    if (on_gpu(src.data)) return launch_accumulate(dst, src, n, compute_);
    Buffer staged = allocate(Tier::device, Category::comm, bytes, Fill::undefined);
    copy(staged.data(), src.data, bytes);
    return launch_accumulate(dst, {staged.data(), src.dtype}, n, compute_);
  }
  std::vector<std::uint8_t> staged;
  const void* from = src.data;
  if (on_gpu(src.data)) {
    staged.resize(bytes);
    copy(staged.data(), src.data, bytes);
    from = staged.data();
  } else {
    synchronize();
  }
  add_into(dst.data, from, n, dst.dtype);
}

void CudaDevice::fill_zero(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  if (!on_gpu(p)) {
    // Host memory: what the GPU queued may still be copying into it.
    synchronize();
    std::memset(p, 0, bytes);
    return;
  }
  bind();
  ZTRAIN_CUDA(cudaMemsetAsync(p, 0, bytes, compute_));
}

namespace {
// The event a CopyWork waits on, destroyed with the work's last copy.
struct CopyEvent {
  cudaEvent_t event = nullptr;
  CopyEvent() { ZTRAIN_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~CopyEvent() { cudaEventDestroy(event); }
  CopyEvent(const CopyEvent&) = delete;
  CopyEvent& operator=(const CopyEvent&) = delete;
};
}  // namespace

CopyWork CudaDevice::copy_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return {};
  bind();
  auto done = std::make_shared<CopyEvent>();  // first: a copy queued is one waited for
  order(copy_, compute_);
  copy_async(dst, src, bytes, copy_);
  ZTRAIN_CUDA(cudaEventRecord(done->event, copy_));
  return CopyWork(
      [this, done] {
        bind();
        ZTRAIN_CUDA(cudaEventSynchronize(done->event));
        ZTRAIN_CUDA(cudaStreamWaitEvent(compute_, done->event, 0));
      },
      [done] {
        const cudaError_t e = cudaEventQuery(done->event);
        if (e == cudaErrorNotReady) {
          cudaGetLastError();  // not an error: keep it from the next launch's check
          return false;
        }
        ZTRAIN_CUDA(e);
        return true;
      });
}

void CudaDevice::copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  ZTRAIN_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

void CudaDevice::synchronize() {
  bind();
  for (cudaStream_t s : {compute_, comm_, copy_}) ZTRAIN_CUDA(cudaStreamSynchronize(s));
}

void* CudaDevice::raw_allocate(Tier tier, Category category, std::size_t bytes, Fill fill) {
  return tier == Tier::device ? allocate_device(bytes, fill)
                              : allocate_host(bytes, pinned(category), fill);
}

void CudaDevice::raw_free(Tier tier, Category category, void* p, std::size_t) noexcept {
  if (tier == Tier::device)
    cache_.release(p);
  else if (pinned(category))
    cudaFreeHost(p);
  else
    std::free(p);
}

void* CudaDevice::allocate_device(std::size_t bytes, Fill fill) {
  const auto limit = budget(Tier::device);
  void* p = cache_.allocate(bytes, limit);
  if (!p) {
    const AllocatorStats s = cache_.stats();
    std::size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw OutOfMemoryError(
        "out of memory on tier 'device' (" + name_ + "): allocating " + format_bytes(bytes) + " (" +
        format_bytes(CachingAllocator::size_class(bytes)) + " with rounding); ztrain holds " +
        format_bytes(s.reserved) + " of the GPU" +
        (limit ? " under a " + format_bytes(*limit) + " budget" : std::string()) +
        ", the GPU has " + format_bytes(free_bytes) + " free of " + format_bytes(total) +
        "; raise [device] memory_limit, shorten micro_batch_size or seq_len, enable "
        "activation_checkpointing, or pick a strategy that shards or offloads more");
  }
  if (fill == Fill::zeros) {
    bind();
    ZTRAIN_CUDA(cudaMemsetAsync(p, 0, bytes, compute_));
  }
  return p;
}

void* CudaDevice::allocate_host(std::size_t bytes, bool pin, Fill fill) {
  void* p = nullptr;
  if (pin) {
    bind();
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      throw OutOfMemoryError("out of memory: CUDA refused " + format_bytes(bytes) +
                             " of pinned host memory; lower the host tier's footprint or set "
                             "[device] pin_memory = false");
    }
  } else {
    const std::size_t align = bytes >= 4096 ? 4096 : 64;
    p = std::aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!p)
      throw OutOfMemoryError("out of memory: the system refused " + format_bytes(bytes) +
                             " on tier 'host'; free memory or lower the run's footprint");
  }
  if (fill == Fill::zeros) std::memset(p, 0, bytes);
  return p;
}

void CudaDevice::bind() const {
  ZTRAIN_CUDA(cudaSetDevice(options_.ordinal));
}

void* CudaDevice::device_alloc(std::size_t bytes) {
  bind();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  ZTRAIN_CUDA(e);
  return p;
}

void CudaDevice::device_free(void* p) {
  bind();
  cudaFree(p);
}

void CudaDevice::drain() {
  synchronize();
}

std::unique_ptr<Device> make_cuda_device(const CudaOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

}  // namespace ztrain::cuda
