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
#include "kernels/kernel_ops.h"
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

  // Every op of ztrain/kernels.h, declared from its one parameter list
  // (kernel_ops.h).
  ZTRAIN_KERNEL_DECLARE_ALL

 private:
  // Scratch device memory for one op.
  Buffer scratch(std::size_t bytes) const;
  // A bias (H) as fp32 in scratch; an empty Buffer for a null one.
  Buffer bias_f32(ConstTypedPtr bias, std::size_t H) const;
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
  bool attention_fits_gemms(AttentionShape s) const;
  void attention_forward_gemm(float* out, float* lse, AttentionInputs in,
                              AttentionShape shape) const;
  void attention_backward_gemm(AttentionGrads d, const float* dout, const float* out,
                               AttentionInputs in, const float* lse, AttentionShape shape) const;

  CudaDevice& device_;
  cudaStream_t stream_;
  bool tf32_;
  DType attention_type_;  // f32: the flash kernel; 16-bit: tensor-core GEMMs
  cublasLtHandle_t lt_ = nullptr;
  Buffer workspace_;
  mutable std::map<GemmKey, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace ztrain::cuda
