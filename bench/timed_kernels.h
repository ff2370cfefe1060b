// TimedKernels: a Kernels decorator that adds up wall time per op, for the
// benchmarks' time split. Each op is timed around the wrapped call; the
// matmuls are also kept by shape (N, C, OC) with their FLOPs, so a
// benchmark can set each shape's rate beside sgemm's at that shape, and
// the memory-bound ops with the bytes they must move (each operand read
// or written once, fp32 activations; the small per-row and per-channel
// vectors left out), to set beside a stream's bandwidth; attention with the
// FLOPs its GEMMs execute and the fewest any implementation must.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <tuple>

#include "kernels/kernel_ops.h"
#include "ztrain/kernels.h"

namespace ztrain::bench {

// The calls of one matmul op at one shape.
struct GemmTime {
  double seconds = 0, flops = 0;
  long calls = 0;
};
// (op, N, C, OC): out (N, OC) = inp (N, C) W (OC, C)^T.
using GemmShape = std::tuple<std::string, std::size_t, std::size_t, std::size_t>;

class TimedKernels final : public Kernels {
 public:
  explicit TimedKernels(const Kernels& inner) : k_(inner) {}
  mutable std::map<std::string, double> seconds;
  mutable std::map<GemmShape, GemmTime> gemms;
  mutable std::map<std::string, double> bytes;  // memory-bound ops only
  mutable std::map<std::string, double> flops;  // attention: what its GEMMs execute
  mutable std::map<std::string, double> least;  // attention: what any implementation must

  // Forgets everything counted so far (the warm-up steps').
  void reset() const {
    seconds.clear();
    gemms.clear();
    bytes.clear();
    flops.clear();
    least.clear();
  }

#define ZTRAIN_TIMED(name, args)                                                            \
  void name ZTRAIN_KERNEL_PARAMS_##name const override {                                    \
    const auto t0 = std::chrono::steady_clock::now();                                       \
    k_.name args;                                                                           \
    const double dt =                                                                       \
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();       \
    seconds[#name] += dt;                                                                   \
    note_gemm(Op<&Kernels::name>{}, dt, ZTRAIN_UNPAREN args);                               \
    if (const double moved_ = moved(Op<&Kernels::name>{}, ZTRAIN_UNPAREN args); moved_ > 0) \
      bytes[#name] += moved_;                                                               \
    if (const double f_ = executed(Op<&Kernels::name>{}, ZTRAIN_UNPAREN args); f_ > 0)      \
      flops[#name] += f_;                                                                   \
    if (const double l_ = needed(Op<&Kernels::name>{}, ZTRAIN_UNPAREN args); l_ > 0)        \
      least[#name] += l_;                                                                   \
  }
#define ZTRAIN_UNPAREN(...) __VA_ARGS__
  ZTRAIN_KERNEL_OPS(ZTRAIN_TIMED)
#undef ZTRAIN_TIMED
#undef ZTRAIN_UNPAREN

 private:
  template <auto>
  struct Op {};
  using Count = std::size_t;
  // Bytes an op must move; 0 for the ops that are not memory-bound
  // (matmuls, attention) or not part of the step's kernels (the optimizer's).
  template <auto M, class... A>
  static double moved(Op<M>, const A&...) {
    return 0;
  }
  static double f32(double elements) {
    return 4 * elements;
  }
  static double elements(RowShape s) {
    return static_cast<double>(s.N) * static_cast<double>(s.C);
  }
  static double elements(TokenShape s) {
    return static_cast<double>(s.B * s.T) * static_cast<double>(s.C);
  }
  static double elements(HeadShape s) {
    return static_cast<double>(s.B * s.T) * static_cast<double>(s.H * s.hs);
  }
  static double moved(Op<&Kernels::embedding_forward>, float*, const std::int32_t*, ConstTypedPtr,
                      ConstTypedPtr wpe, TokenShape s) {
    return f32(elements(s) * (wpe.data ? 3 : 2));  // rows read, out written
  }
  static double moved(Op<&Kernels::embedding_backward>, TypedPtr, TypedPtr, const float*,
                      const std::int32_t*, TokenShape s) {
    return f32(3 * elements(s));  // dout read, gradient rows read and written
  }
  static double moved(Op<&Kernels::layernorm_forward>, float*, float*, float*, const float*,
                      ConstTypedPtr, ConstTypedPtr, RowShape s, float) {
    return f32(2 * elements(s));
  }
  static double moved(Op<&Kernels::layernorm_backward>, float*, TypedPtr, TypedPtr, const float*,
                      const float*, ConstTypedPtr, const float*, const float*, RowShape s) {
    return f32(4 * elements(s));  // dout, inp and dinp read, dinp written (it accumulates)
  }
  static double moved(Op<&Kernels::add_layernorm_forward>, float*, float*, float*, float*,
                      const float*, const float*, ConstTypedPtr, ConstTypedPtr, RowShape s, float) {
    return f32(4 * elements(s));  // a and b read, res and out written
  }
  static double moved(Op<&Kernels::add_rmsnorm_forward>, float*, float*, float*, const float*,
                      const float*, ConstTypedPtr, RowShape s, float) {
    return f32(4 * elements(s));
  }
  static double moved(Op<&Kernels::rmsnorm_forward>, float*, float*, const float*, ConstTypedPtr,
                      RowShape s, float) {
    return f32(2 * elements(s));
  }
  static double moved(Op<&Kernels::rmsnorm_backward>, float*, TypedPtr, const float*, const float*,
                      ConstTypedPtr, const float*, RowShape s) {
    return f32(4 * elements(s));
  }
  static double moved(Op<&Kernels::gelu_forward>, float*, const float*, ConstTypedPtr, RowShape s) {
    return f32(2 * elements(s));  // pre read, out written (the bias row stays in cache)
  }
  static double moved(Op<&Kernels::gelu_backward>, float*, TypedPtr, const float*, ConstTypedPtr,
                      const float*, RowShape s) {
    return f32(3 * elements(s));  // pre, dout read; dpre written
  }
  static double moved(Op<&Kernels::swiglu_forward>, float*, const float*, const float*, Count n) {
    return f32(3.0 * static_cast<double>(n));
  }
  static double moved(Op<&Kernels::swiglu_backward>, float*, float*, const float*, const float*,
                      const float*, Count n) {
    return f32(7.0 *
               static_cast<double>(n));  // dout, gate, up, dgate, dup read; dgate, dup written
  }
  static double moved(Op<&Kernels::rope_forward>, float*, const float*, const float*, HeadShape s) {
    return f32(2 * elements(s));  // in place
  }
  static double moved(Op<&Kernels::rope_backward>, float*, const float*, const float*,
                      HeadShape s) {
    return f32(2 * elements(s));
  }
  static double moved(Op<&Kernels::add>, float*, const float*, const float*, Count n) {
    return f32(3.0 * static_cast<double>(n));
  }
  static double moved(Op<&Kernels::softmax_crossentropy_forward>, float*, float*,
                      const std::int32_t*, RowShape s) {
    return f32(2 * elements(s));  // logits read, probabilities written in place
  }
  static double moved(Op<&Kernels::softmax_crossentropy_backward>, float*, const std::int32_t*,
                      float, RowShape s) {
    return f32(2 * elements(s));
  }

  // Attention's GEMMs as the cpu kernels run them on OpenBLAS: per (batch,
  // query head), each block of 64 queries against the keys up to the
  // block's end, hs deep; two products forward (scores, output), five
  // backward (scores again, dP, dV, dQ, dK). The masked half is not
  // counted: it is not run. On AVX-512 the kernel of block_gemm.h also
  // skips the tiles of each block past its queries' last keys (14 % of
  // this at T = 256), so it can pass the roofline counted from this.
  template <auto M, class... A>
  static double executed(Op<M>, const A&...) {
    return 0;
  }
  static double causal_blocks(std::size_t T) {
    double sum = 0;
    for (std::size_t t0 = 0; t0 < T; t0 += 64) {
      const std::size_t rows = std::min<std::size_t>(64, T - t0);
      sum += static_cast<double>(rows) * static_cast<double>(t0 + rows);
    }
    return sum;
  }
  static double heads(AttentionShape s) {
    return 2.0 * static_cast<double>(s.B * s.NH * s.hs);
  }
  static double executed(Op<&Kernels::attention_forward>, float*, float*, AttentionInputs,
                         AttentionShape s) {
    return 2 * heads(s) * causal_blocks(s.T);
  }
  static double executed(Op<&Kernels::attention_backward>, AttentionGrads, const float*,
                         const float*, AttentionInputs, const float*, AttentionShape s) {
    return 5 * heads(s) * causal_blocks(s.T);
  }

  // Attention's FLOPs at the least: the causal triangle exactly (T (T+1) / 2
  // scores per (batch, query head)), two products forward and four backward
  // (an implementation that keeps the scores need not recompute them).
  template <auto M, class... A>
  static double needed(Op<M>, const A&...) {
    return 0;
  }
  static double triangle(std::size_t T) {
    return 0.5 * static_cast<double>(T) * (static_cast<double>(T) + 1.0);
  }
  static double needed(Op<&Kernels::attention_forward>, float*, float*, AttentionInputs,
                       AttentionShape s) {
    return 2 * heads(s) * triangle(s.T);
  }
  static double needed(Op<&Kernels::attention_backward>, AttentionGrads, const float*, const float*,
                       AttentionInputs, const float*, AttentionShape s) {
    return 4 * heads(s) * triangle(s.T);
  }

  // matmul_forward: 2 N C OC FLOPs; matmul_backward: dW's 2 N C OC and,
  // when dinp is wanted, as many again. Other ops pass through.
  template <auto M, class... A>
  void note_gemm(Op<M>, double, const A&...) const {}
  void note_gemm(Op<&Kernels::matmul_forward>, double dt, float*, const float*, ConstTypedPtr,
                 ConstTypedPtr, MatmulShape s) const {
    add_gemm("matmul_forward", dt, s, 1);
  }
  void note_gemm(Op<&Kernels::matmul_backward>, double dt, float* dinp, TypedPtr, TypedPtr,
                 const float*, const float*, ConstTypedPtr, MatmulShape s) const {
    add_gemm("matmul_backward", dt, s, dinp ? 2 : 1);
  }
  void add_gemm(const char* op, double dt, MatmulShape s, int products) const {
    GemmTime& g = gemms[{op, s.N, s.C, s.OC}];
    g.seconds += dt;
    g.flops += products * 2.0 * static_cast<double>(s.N) * static_cast<double>(s.C * s.OC);
    ++g.calls;
  }

  const Kernels& k_;
};

}  // namespace ztrain::bench
