// Helpers of the GPU tests: one device and its kernels for the whole test
// program, arrays copied to and from it, and the comparison every kernel
// test makes against its cpu reference.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/cuda_device.h"
#include "ztrain/dtype.h"
#include "ztrain/kernels.h"

namespace gpu {

using Vec = std::vector<float>;

ztrain::cuda::CudaDevice& device();
// Kernels with exact fp32 GEMMs (TF32 off).
const ztrain::Kernels& kernels();

// A device array holding a copy of host values (typed: rounded on the host
// with dtype.h, the same bits the cpu reference reads).
class Array {
 public:
  Array(std::size_t n, ztrain::DType type = ztrain::DType::f32);
  explicit Array(const Vec& v, ztrain::DType type = ztrain::DType::f32);
  // Token ids (int32, as the kernels read them).
  explicit Array(const std::vector<std::int32_t>& tokens);
  float* f() const { return buf_.as<float>(); }
  const std::int32_t* i32() const { return buf_.as<std::int32_t>(); }
  void* data() const { return buf_.data(); }
  ztrain::TypedPtr typed() const { return {buf_.data(), type_}; }
  // The values, widened to fp32.
  Vec get() const;

 private:
  void upload_bytes(const void* src, std::size_t bytes);
  ztrain::Buffer buf_;
  std::size_t n_;
  ztrain::DType type_;
};

// One value of a plain type in device memory (StepScalars, a loss total).
template <class T>
class Scalar {
 public:
  explicit Scalar(const T& v = T{})
      : buf_(device().allocate(ztrain::Tier::device, ztrain::Category::grads, sizeof(T),
                               ztrain::Fill::undefined)) {
    device().copy(buf_.data(), &v, sizeof(T));
  }
  T* ptr() const { return buf_.as<T>(); }
  T get() const {
    T v;
    device().copy(&v, buf_.data(), sizeof(T));
    return v;
  }

 private:
  ztrain::Buffer buf_;
};

Vec randn(std::size_t n, std::uint32_t seed, float scale = 1.0f);
// Values rounded through `type` and back (what a typed operand holds).
Vec rounded(const Vec& v, ztrain::DType type);

// |got - want| <= atol + rtol |want| everywhere; reports the worst element.
void check_close(const Vec& got, const Vec& want, double rtol, double atol, const char* what);

}  // namespace gpu
