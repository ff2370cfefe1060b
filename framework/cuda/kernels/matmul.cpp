// GEMMs through cuBLASLt. The kernels' row-major (N,C) tensors are
// column-major (C,N) ones to cuBLAS, so with w (OC,C):
//   out^T (OC,N)  = w^T^T . inp^T :  A = w (C x OC, ld C) transposed, B = inp (C x N)
//   dinp^T (C,N) += w^T . dout^T  :  A = w (C x OC), B = dout (OC x N)
//   dw^T (C,OC)  += inp^T . dout  :  A = inp (C x N), B = dout (OC x N) transposed
// A 16-bit weight makes the activation operands round to its type (into
// scratch) so the GEMM runs on tensor cores with fp32 accumulation and an
// fp32 output; the weight gradient's GEMM runs in its own type, adding
// into it with beta = 1 and rounding once. The forward's bias is added by
// cuBLASLt's epilogue as the output is written (CUBLASLT_EPILOGUE_BIAS,
// from an fp32 copy of it: the epilogue's bias has the output's type), not
// in a pass of its own over the (N,OC) output.
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/bias.h"

namespace ztrain::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
  }
  throw InternalError("cuda matmul: unknown dtype");
}

// The largest power of two (up to 256) dividing the address and, for a
// batch, the byte stride between its matrices: cuBLASLt's heuristics
// assume 256-byte aligned operands unless told otherwise, and a view into
// a flat parameter buffer may start anywhere.
std::uint32_t alignment(const void* p, std::uint64_t stride_bytes = 0) {
  const auto a = reinterpret_cast<std::uintptr_t>(p) | stride_bytes;
  std::uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// A batch of `count` matrices `stride` elements apart in a layout.
void set_batch(cublasLtMatrixLayout_t layout, int count, std::int64_t stride) {
  if (count == 1) return;
  ZTRAIN_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof(count)));
  ZTRAIN_CUBLAS(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

template <class T, class Destroy>
struct Owned {
  T handle = nullptr;
  Destroy destroy;
  ~Owned() {
    if (handle) destroy(handle);
  }
};

}  // namespace

void CudaKernels::gemm(const GemmCall& g) const {
  if (g.m == 0 || g.n == 0) return;
  // fp32 inputs may use TF32 tensor cores when asked; 16-bit ones always
  // accumulate in fp32.
  const bool fp32 = g.a_type == DType::f32;
  const cublasComputeType_t compute =
      fp32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Owned<cublasLtMatmulDesc_t, decltype(&cublasLtMatmulDescDestroy)> desc{nullptr,
                                                                         cublasLtMatmulDescDestroy};
  ZTRAIN_CUBLAS(cublasLtMatmulDescCreate(&desc.handle, compute, CUDA_R_32F));
  const cublasOperation_t ta = g.a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZTRAIN_CUBLAS(
      cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  ZTRAIN_CUBLAS(
      cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ZTRAIN_CUBLAS(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                 &epilogue, sizeof(epilogue)));
    ZTRAIN_CUBLAS(cublasLtMatmulDescSetAttribute(desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &g.bias, sizeof(g.bias)));
  }
  using Layout = Owned<cublasLtMatrixLayout_t, decltype(&cublasLtMatrixLayoutDestroy)>;
  Layout la{nullptr, cublasLtMatrixLayoutDestroy}, lb{nullptr, cublasLtMatrixLayoutDestroy},
      ld{nullptr, cublasLtMatrixLayoutDestroy};
  // Stored shapes (before op): A is (m x k) or (k x m), B (k x n) or (n x k).
  ZTRAIN_CUBLAS(cublasLtMatrixLayoutCreate(&la.handle, cuda_type(g.a_type), g.a_trans ? g.k : g.m,
                                           g.a_trans ? g.m : g.k, g.lda));
  ZTRAIN_CUBLAS(cublasLtMatrixLayoutCreate(&lb.handle, cuda_type(g.b_type), g.b_trans ? g.n : g.k,
                                           g.b_trans ? g.k : g.n, g.ldb));
  ZTRAIN_CUBLAS(cublasLtMatrixLayoutCreate(&ld.handle, cuda_type(g.d_type), g.m, g.n, g.ldd));
  set_batch(la.handle, g.batch, g.stride_a);
  set_batch(lb.handle, g.batch, g.stride_b);
  set_batch(ld.handle, g.batch, g.stride_d);

  Owned<cublasLtMatmulPreference_t, decltype(&cublasLtMatmulPreferenceDestroy)> pref{
      nullptr, cublasLtMatmulPreferenceDestroy};
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.handle));
  const std::uint64_t ws = workspace_.bytes();
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const std::uint32_t align_a = alignment(g.a, g.stride_a * dtype_size(g.a_type)),
                      align_b = alignment(g.b, g.stride_b * dtype_size(g.b_type)),
                      align_d = alignment(g.d, g.stride_d * dtype_size(g.d_type));
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  ZTRAIN_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));

  // The heuristic costs tens of microseconds; a model asks for the same
  // few shapes every step, so its answer is kept per shape.
  const GemmKey key{
      g.m,     g.n,        g.k,        g.lda,     g.ldb,    g.ldd,    align_a, align_b,
      align_d, g.a_trans,  g.b_trans,  g.a_type,  g.b_type, g.d_type, compute, g.bias != nullptr,
      g.batch, g.stride_a, g.stride_b, g.stride_d};
  auto known = algos_.find(key);
  if (known == algos_.end()) {
    cublasLtMatmulHeuristicResult_t best{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, desc.handle, la.handle, lb.handle, ld.handle, ld.handle,
                                       pref.handle, 1, &best, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
      throw Error("cuBLASLt has no algorithm for a " + std::string(dtype_name(g.a_type)) +
                  " GEMM of " + std::to_string(g.m) + " x " + std::to_string(g.n) + " x " +
                  std::to_string(g.k) + " on this GPU");
    ZTRAIN_CUBLAS(st);
    known = algos_.emplace(key, best.algo).first;
  }
  ZTRAIN_CUBLAS(cublasLtMatmul(lt_, desc.handle, &g.alpha, g.a, la.handle, g.b, lb.handle, &g.beta,
                               g.d, ld.handle, g.d, ld.handle, &known->second, workspace_.data(),
                               ws, stream_));
}

// out: (N,OC) = inp (N,C) @ w^T + bias
void CudaKernels::matmul_forward(float* out, const float* inp, ConstTypedPtr w, ConstTypedPtr bias,
                                 MatmulShape s) const {
  const int N = to_int(s.N, "matmul_forward", "N"), C = to_int(s.C, "matmul_forward", "C"),
            OC = to_int(s.OC, "matmul_forward", "OC");
  if (N == 0 || OC == 0) return;
  const Buffer bias32 = bias_f32(bias, s.OC);
  Buffer inp16;
  const void* x = inp;
  if (w.dtype != DType::f32) {
    inp16 = rounded(inp, s.N * s.C, w.dtype);
    x = inp16.data();
  }
  gemm({w.data, w.dtype, true, C, x, w.dtype, false, C, out, DType::f32, OC, OC, N, C, 0.0f,
        bias ? bias32.as<float>() : nullptr});
}

// dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp; dbias (OC) += column sums of dout
void CudaKernels::matmul_backward(float* dinp, TypedPtr dw, TypedPtr dbias, const float* dout,
                                  const float* inp, ConstTypedPtr w, MatmulShape s) const {
  const int N = to_int(s.N, "matmul_backward", "N"), C = to_int(s.C, "matmul_backward", "C"),
            OC = to_int(s.OC, "matmul_backward", "OC");
  if (N == 0) return;
  // dout rounded once to each 16-bit type the two GEMMs need (one, when
  // the weight and its gradient share a type, as they do in a run).
  Buffer dout_w, dout_dw;
  const auto dout_as = [&](DType t, Buffer& keep) -> const void* {
    if (t == DType::f32) return dout;
    if (dout_w && t == w.dtype) return dout_w.data();
    keep = rounded(dout, s.N * s.OC, t);
    return keep.data();
  };
  if (dinp) {
    const void* d = dout_as(w.dtype, dout_w);
    gemm({w.data, w.dtype, false, C, d, w.dtype, false, OC, dinp, DType::f32, C, C, N, OC, 1.0f});
  }
  if (dw) {
    const void* d = dout_as(dw.dtype, dout_dw);
    Buffer inp16;
    const void* x = inp;
    if (dw.dtype != DType::f32) {
      inp16 = rounded(inp, s.N * s.C, dw.dtype);
      x = inp16.data();
    }
    gemm({x, dw.dtype, false, C, d, dw.dtype, true, OC, dw.data, dw.dtype, C, C, OC, N, 1.0f});
  }
  if (dbias) {
    Buffer partial = scratch(sizeof(float) * bias_gradient_scratch(N, OC));
    add_bias_gradient(dbias, dout, N, OC, partial.as<float>(), stream_);
  }
}

}  // namespace ztrain::cuda
