// ReferenceKernels: the plain cpu implementation of every op, kept beside
// the fast one as the reference the tests compare it with (and the
// implementation of the ops that have no fast version yet).
#pragma once

#include <memory>

#include "ztrain/kernels.h"

#include "kit/kit_export.h"

namespace ztrain {

class ReferenceKernels : public Kernels {
 public:
  void embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                         ConstTypedPtr wpe, int B, int T, int C) const override;
  void embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                          const std::int32_t* tokens, int B, int T, int C) const override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, ConstTypedPtr w,
                         ConstTypedPtr b, int N, int C, float eps) const override;
  void layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                          const float* inp, ConstTypedPtr w, const float* mean, const float* rstd,
                          int N, int C) const override;
  // The reference's fused ops are add, then the norm.
  void add_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                             const float* b, ConstTypedPtr w, ConstTypedPtr bias, int N, int C,
                             float eps) const override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w, int N, int C,
                       float eps) const override;
  void rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                        ConstTypedPtr w, const float* rstd, int N, int C) const override;
  void add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                           ConstTypedPtr w, int N, int C, float eps) const override;
  void matmul_forward(float* out, const float* inp, ConstTypedPtr w, ConstTypedPtr bias, int N,
                      int C, int OC) const override;
  void matmul_backward(float* dinp, TypedPtr dw, TypedPtr dbias, const float* dout,
                       const float* inp, ConstTypedPtr w, int N, int C, int OC) const override;
  void gelu_forward(float* out, const float* pre, ConstTypedPtr bias, int N, int H) const override;
  void gelu_backward(float* dpre, TypedPtr dbias, const float* pre, ConstTypedPtr bias,
                     const float* dout, int N, int H) const override;
  void swiglu_forward(float* out, const float* gate, const float* up, std::size_t n) const override;
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, std::size_t n) const override;
  void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int H, int hs,
                    int stride) const override;
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int H, int hs,
                     int stride) const override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int B, int T, int NH, int NKV, int hs, int q_stride,
                         int kv_stride) const override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* q, const float* k, const float* v, const float* lse, int B,
                          int T, int NH, int NKV, int hs, int q_stride,
                          int kv_stride) const override;
  void add(float* out, const float* a, const float* b, std::size_t n) const override;
  void softmax_crossentropy_forward(float* losses, float* logits, const std::int32_t* targets,
                                    int N, int V) const override;
  void softmax_crossentropy_backward(float* probs, const std::int32_t* targets, float dloss, int N,
                                     int V) const override;
  void sum_squares_add(StepScalars* s, ConstTypedPtr x, std::size_t n) const override;
  void grad_norm_unscale(StepScalars* s, double loss_scale) const override;
  void grad_norm_finish(StepScalars* s, bool across_ranks, double loss_scale,
                        double grad_clip) const override;
  void adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working, const AdamWRun* runs,
             std::size_t run_count, const AdamWHyper& h, const StepScalars* s,
             GradAfter grad_after) const override;
  void mean_add(double* acc, const float* x, std::size_t n) const override;
};

ZTRAIN_KIT std::unique_ptr<Kernels> make_reference_cpu_kernels();

}  // namespace ztrain
