// TimedKernels: a Kernels decorator that adds up wall time per op, for the
// benchmarks' time split. Each op is timed around the wrapped call.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "ztrain/kernels.h"

namespace ztrain::bench {

class TimedKernels final : public Kernels {
 public:
  explicit TimedKernels(const Kernels& inner) : k_(inner) {}
  mutable std::map<std::string, double> seconds;

#define ZTRAIN_TIMED(name, params, args)                                              \
  void name params const override {                                                   \
    const auto t0 = std::chrono::steady_clock::now();                                 \
    k_.name args;                                                                     \
    seconds[#name] +=                                                                 \
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); \
  }
  ZTRAIN_TIMED(embedding_forward,
               (float* a, const std::int32_t* b, ConstTypedPtr c, ConstTypedPtr d, int e, int f,
                int g),
               (a, b, c, d, e, f, g))
  ZTRAIN_TIMED(embedding_backward,
               (TypedPtr a, TypedPtr b, const float* c, const std::int32_t* d, int e, int f, int g),
               (a, b, c, d, e, f, g))
  ZTRAIN_TIMED(layernorm_forward,
               (float* a, float* b, float* c, const float* d, ConstTypedPtr e, ConstTypedPtr f,
                int g, int h, float i),
               (a, b, c, d, e, f, g, h, i))
  ZTRAIN_TIMED(layernorm_backward,
               (float* a, TypedPtr b, TypedPtr c, const float* d, const float* e, ConstTypedPtr f,
                const float* g, const float* h, int i, int j),
               (a, b, c, d, e, f, g, h, i, j))
  ZTRAIN_TIMED(rmsnorm_forward,
               (float* a, float* b, const float* c, ConstTypedPtr d, int e, int f, float g),
               (a, b, c, d, e, f, g))
  ZTRAIN_TIMED(rmsnorm_backward,
               (float* a, TypedPtr b, const float* c, const float* d, ConstTypedPtr e,
                const float* f, int g, int h),
               (a, b, c, d, e, f, g, h))
  ZTRAIN_TIMED(matmul_forward,
               (float* a, const float* b, ConstTypedPtr c, ConstTypedPtr d, int e, int f, int g),
               (a, b, c, d, e, f, g))
  ZTRAIN_TIMED(matmul_backward,
               (float* a, TypedPtr b, TypedPtr c, const float* d, const float* e, ConstTypedPtr f,
                int g, int h, int i),
               (a, b, c, d, e, f, g, h, i))
  ZTRAIN_TIMED(gelu_forward, (float* a, const float* b, std::size_t c), (a, b, c))
  ZTRAIN_TIMED(gelu_backward, (float* a, const float* b, const float* c, std::size_t d),
               (a, b, c, d))
  ZTRAIN_TIMED(swiglu_forward, (float* a, const float* b, const float* c, std::size_t d),
               (a, b, c, d))
  ZTRAIN_TIMED(swiglu_backward,
               (float* a, float* b, const float* c, const float* d, const float* e, std::size_t f),
               (a, b, c, d, e, f))
  ZTRAIN_TIMED(rope_forward,
               (float* a, const float* b, const float* c, int d, int e, int f, int g, int h),
               (a, b, c, d, e, f, g, h))
  ZTRAIN_TIMED(rope_backward,
               (float* a, const float* b, const float* c, int d, int e, int f, int g, int h),
               (a, b, c, d, e, f, g, h))
  ZTRAIN_TIMED(attention_forward,
               (float* a, float* b, const float* c, const float* d, const float* e, int f, int g,
                int h, int i, int j, int k, int l),
               (a, b, c, d, e, f, g, h, i, j, k, l))
  ZTRAIN_TIMED(attention_backward,
               (float* a, float* b, float* c, const float* d, const float* e, const float* f,
                const float* g, const float* h, const float* i, int j, int k, int l, int m, int n,
                int o, int p),
               (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p))
  ZTRAIN_TIMED(add, (float* a, const float* b, const float* c, std::size_t d), (a, b, c, d))
  ZTRAIN_TIMED(softmax_crossentropy_forward,
               (float* a, float* b, const std::int32_t* c, int d, int e), (a, b, c, d, e))
  ZTRAIN_TIMED(softmax_crossentropy_backward,
               (float* a, const std::int32_t* b, float c, int d, int e), (a, b, c, d, e))
  ZTRAIN_TIMED(adamw,
               (float* a, TypedPtr b, float* c, float* d, TypedPtr e, std::size_t f, float g,
                float h, float i, float j, float k, float l, float m, float n, GradAfter o),
               (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o))
#undef ZTRAIN_TIMED
  double sum(const float* x, std::size_t n) const override {
    const auto t0 = std::chrono::steady_clock::now();
    const double r = k_.sum(x, n);
    seconds["sum"] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  double sum_squares(ConstTypedPtr x, std::size_t n) const override {
    const auto t0 = std::chrono::steady_clock::now();
    const double r = k_.sum_squares(x, n);
    seconds["sum_squares"] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  const Kernels& k_;
};

}  // namespace ztrain::bench
