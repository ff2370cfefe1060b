#include "gpu_support.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "comm/world.h"
#include "cuda/cuda_backend.h"
#include "ztrain/comm.h"

namespace gpu {

ztrain::cuda::CudaDevice& device() {
  // One GPU per rank of a multi-rank test (main() checked there are enough).
  static const auto dev = [] {
    ztrain::cuda::CudaOptions o;
    o.ordinal = ztrain::launcher_rank() % std::max(1, ztrain::local_rank_count());
    return ztrain::cuda::make_cuda_device(o);
  }();
  return static_cast<ztrain::cuda::CudaDevice&>(*dev);
}

const ztrain::Kernels& kernels() {
  static const auto k = ztrain::cuda::make_cuda_kernels(device(), {});
  return *k;
}

Array::Array(std::size_t n, ztrain::DType type)
    : buf_(device().allocate(ztrain::Tier::device, ztrain::Category::activations,
                             n * ztrain::dtype_size(type))),
      n_(n),
      type_(type) {
  device().synchronize();  // the zero fill
}

Array::Array(const Vec& v, ztrain::DType type) : Array(v.size(), type) {
  std::vector<std::uint8_t> bytes(v.size() * ztrain::dtype_size(type));
  ztrain::convert(v.data(), ztrain::DType::f32, bytes.data(), type, v.size());
  upload_bytes(bytes.data(), bytes.size());
}

Array::Array(const std::vector<std::int32_t>& tokens) : Array(tokens.size()) {
  upload_bytes(tokens.data(), tokens.size() * sizeof(std::int32_t));
}

void Array::upload_bytes(const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  // A copy from pageable memory may return before the bytes land, and
  // nothing orders it with the device's non-blocking compute stream.
  REQUIRE(cudaMemcpy(buf_.data(), src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

Vec Array::get() const {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<std::uint8_t> bytes(n_ * ztrain::dtype_size(type_));
  if (!bytes.empty())
    REQUIRE(cudaMemcpy(bytes.data(), buf_.data(), bytes.size(), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
  Vec v(n_);
  ztrain::convert(bytes.data(), type_, v.data(), ztrain::DType::f32, n_);
  return v;
}

Vec randn(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Vec rounded(const Vec& v, ztrain::DType type) {
  std::vector<std::uint8_t> bytes(v.size() * ztrain::dtype_size(type));
  ztrain::convert(v.data(), ztrain::DType::f32, bytes.data(), type, v.size());
  Vec out(v.size());
  ztrain::convert(bytes.data(), type, out.data(), ztrain::DType::f32, v.size());
  return out;
}

void check_close(const Vec& got, const Vec& want, double rtol, double atol, const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double allowed = atol + rtol * std::fabs(want[i]);
    const double excess = std::isnan(got[i]) ? 1e30 : err - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
    if (excess > 0) ++bad;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements outside " << rtol << " rel + "
            << atol << " abs; worst [" << worst << "]: gpu " << got[worst] << ", cpu "
            << want[worst]);
  CHECK(bad == 0);
}

}  // namespace gpu
