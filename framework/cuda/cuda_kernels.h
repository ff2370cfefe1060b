// CudaKernels: every op of ztrain/kernels.h on one GPU, on the device's
// compute stream. Pointers are device pointers (tokens and targets too);
// scalars come from the host. The contract is the cpu one: fp32
// activations, typed parameters and gradients read in fp32, a 16-bit
// gradient rounded once per op, backward adding into its outputs,
// bit-identical results run to run (no atomics: every output element is
// summed by one thread in a fixed order).
//
// One difference, made for tensor cores: a GEMM whose weight is 16-bit
// takes its activation operand rounded to the weight's type (as PyTorch's
// autocast does), and accumulates in fp32. fp32 GEMMs are exact fp32
// unless tf32 is on.
//
// Each op's forward/backward pair lives in kernels/<op>.cu beside its
// shapes; matmul.cpp drives cuBLASLt. Scratch (16-bit copies of operands,
// reduction partials) comes from the device's allocator and is returned
// at the end of the op, to be reused once the GPU has passed it.
// Thread safety: as Kernels (one driving thread).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cuda/cuda_device.h"
#include "ztrain/kernels.h"

namespace ztrain::cuda {

// D (m x n, ld ldd) = alpha op(A) op(B) + beta D (+ bias, fp32, m, added
// to every column when not null); A is (m x k) after op, B (k x n) after
// op; C is D (in place). With batch > 1, `batch` such products, the
// matrices of each operand stride_* elements apart.
struct GemmCall {
  const void* a;
  DType a_type;
  bool a_trans;
  int lda;
  const void* b;
  DType b_type;
  bool b_trans;
  int ldb;
  void* d;
  DType d_type;
  int ldd;
  int m, n, k;
  float beta;
  const float* bias = nullptr;
  float alpha = 1.0f;
  int batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_d = 0;
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels(CudaDevice& device, const KernelOptions& options);
  ~CudaKernels() override;

  void embedding_forward(float* out, const std::int32_t* tokens, ConstTypedPtr wte,
                         ConstTypedPtr wpe, int B, int T, int C) const override;
  void embedding_backward(TypedPtr dwte, TypedPtr dwpe, const float* dout,
                          const std::int32_t* tokens, int B, int T, int C) const override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, ConstTypedPtr w,
                         ConstTypedPtr b, int N, int C, float eps) const override;
  void layernorm_backward(float* dinp, TypedPtr dw, TypedPtr db, const float* dout,
                          const float* inp, ConstTypedPtr w, const float* mean, const float* rstd,
                          int N, int C) const override;
  void add_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                             const float* b, ConstTypedPtr w, ConstTypedPtr bias, int N, int C,
                             float eps) const override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, ConstTypedPtr w, int N, int C,
                       float eps) const override;
  void add_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                           ConstTypedPtr w, int N, int C, float eps) const override;
  void rmsnorm_backward(float* dinp, TypedPtr dw, const float* dout, const float* inp,
                        ConstTypedPtr w, const float* rstd, int N, int C) const override;
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

 private:
  // Scratch device memory for one op.
  Buffer scratch(std::size_t bytes) const;
  // A bias (H) as fp32 in scratch; an empty Buffer for a null one.
  Buffer bias_f32(ConstTypedPtr bias, int H) const;
  // x (n floats) rounded to `type` into scratch.
  Buffer rounded(const float* x, std::size_t n, DType type) const;
  // n elements reduced on the GPU: launch_partials(partial, chunks) writes
  // one partial per chunk, finish(partial, chunks) combines them
  // (reductions.cu).
  template <class Partial, class Finish>
  void reduce_on_device(std::size_t n, Partial&& launch_partials, Finish&& finish) const;
  // Over column-major operands, through cuBLASLt (matmul.cpp).
  void gemm(const GemmCall& g) const;
  // What picks a cuBLASLt algorithm: shapes, leading dimensions, operand
  // alignments, transposes, types, compute type, the bias epilogue and the
  // batch.
  using GemmKey = std::tuple<int, int, int, int, int, int, std::uint32_t, std::uint32_t,
                             std::uint32_t, bool, bool, DType, DType, DType, cublasComputeType_t,
                             bool, int, std::int64_t, std::int64_t, std::int64_t>;
  // Attention as tensor-core GEMMs on operands of attention_type_ (16-bit;
  // attention_gemm.cu), with attention_forward/backward's arguments, where
  // attention_fits_gemms: a 16-bit run whose sequence is short enough for
  // one head's scores to fit the scratch it allows.
  bool attention_fits_gemms(int B, int T, int NH) const;
  void attention_forward_gemm(float* out, float* lse, const float* q, const float* k,
                              const float* v, int B, int T, int NH, int NKV, int hs, int q_stride,
                              int kv_stride) const;
  void attention_backward_gemm(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* q, const float* k, const float* v, const float* lse,
                               int B, int T, int NH, int NKV, int hs, int q_stride,
                               int kv_stride) const;

  CudaDevice& device_;
  cudaStream_t stream_;
  bool tf32_;
  DType attention_type_;  // f32: the flash kernel; 16-bit: tensor-core GEMMs
  cublasLtHandle_t lt_ = nullptr;
  Buffer workspace_;
  mutable std::map<GemmKey, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace ztrain::cuda
