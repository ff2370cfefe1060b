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
#include <type_traits>

#include "kernels/kernel_ops.h"
#include "ztrain/kernels.h"

namespace ztrain::bench {

// The calls of one matmul op at one shape.
struct GemmTime {
  double seconds = 0, flops = 0;
  long calls = 0;
};
// (op, N, C, OC): out (N, OC) = inp (N, C) W (OC, C)^T.
using GemmShape = std::tuple<std::string, int, int, int>;

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

#define ZTRAIN_TIMED(name, params, args)                                                    \
  void name params const override {                                                         \
    const auto t0 = std::chrono::steady_clock::now();                                       \
    k_.name args;                                                                           \
    const double dt =                                                                       \
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();       \
    seconds[#name] += dt;                                                                   \
    [&](const auto&... x) { note_gemm(#name, dt, x...); } args;                             \
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
  static double moved(Op<&Kernels::embedding_forward>, float*, const std::int32_t*, ConstTypedPtr,
                      ConstTypedPtr wpe, int B, int T, int C) {
    return f32(double(B) * T * C * (wpe.data ? 3 : 2));  // rows read, out written
  }
  static double moved(Op<&Kernels::embedding_backward>, TypedPtr, TypedPtr, const float*,
                      const std::int32_t*, int B, int T, int C) {
    return f32(3.0 * B * T * C);  // dout read, gradient rows read and written
  }
  static double moved(Op<&Kernels::layernorm_forward>, float*, float*, float*, const float*,
                      ConstTypedPtr, ConstTypedPtr, int N, int C, float) {
    return f32(2.0 * N * C);
  }
  static double moved(Op<&Kernels::layernorm_backward>, float*, TypedPtr, TypedPtr, const float*,
                      const float*, ConstTypedPtr, const float*, const float*, int N, int C) {
    return f32(4.0 * N * C);  // dout, inp and dinp read, dinp written (it accumulates)
  }
  static double moved(Op<&Kernels::add_layernorm_forward>, float*, float*, float*, float*,
                      const float*, const float*, ConstTypedPtr, ConstTypedPtr, int N, int C,
                      float) {
    return f32(4.0 * N * C);  // a and b read, res and out written
  }
  static double moved(Op<&Kernels::add_rmsnorm_forward>, float*, float*, float*, const float*,
                      const float*, ConstTypedPtr, int N, int C, float) {
    return f32(4.0 * N * C);
  }
  static double moved(Op<&Kernels::rmsnorm_forward>, float*, float*, const float*, ConstTypedPtr,
                      int N, int C, float) {
    return f32(2.0 * N * C);
  }
  static double moved(Op<&Kernels::rmsnorm_backward>, float*, TypedPtr, const float*, const float*,
                      ConstTypedPtr, const float*, int N, int C) {
    return f32(4.0 * N * C);
  }
  static double moved(Op<&Kernels::gelu_forward>, float*, const float*, ConstTypedPtr, int N,
                      int H) {
    return f32(2.0 * N * H);  // pre read, out written (the bias row stays in cache)
  }
  static double moved(Op<&Kernels::gelu_backward>, float*, TypedPtr, const float*, ConstTypedPtr,
                      const float*, int N, int H) {
    return f32(3.0 * N * H);  // pre, dout read; dpre written
  }
  static double moved(Op<&Kernels::swiglu_forward>, float*, const float*, const float*, Count n) {
    return f32(3.0 * n);
  }
  static double moved(Op<&Kernels::swiglu_backward>, float*, float*, const float*, const float*,
                      const float*, Count n) {
    return f32(7.0 * n);  // dout, gate, up, dgate, dup read; dgate, dup written
  }
  static double moved(Op<&Kernels::rope_forward>, float*, const float*, const float*, int B, int T,
                      int H, int hs, int) {
    return f32(2.0 * B * T * H * hs);  // in place
  }
  static double moved(Op<&Kernels::rope_backward>, float*, const float*, const float*, int B, int T,
                      int H, int hs, int) {
    return f32(2.0 * B * T * H * hs);
  }
  static double moved(Op<&Kernels::add>, float*, const float*, const float*, Count n) {
    return f32(3.0 * n);
  }
  static double moved(Op<&Kernels::softmax_crossentropy_forward>, float*, float*,
                      const std::int32_t*, int N, int V) {
    return f32(2.0 * N * V);  // logits read, probabilities written in place
  }
  static double moved(Op<&Kernels::softmax_crossentropy_backward>, float*, const std::int32_t*,
                      float, int N, int V) {
    return f32(2.0 * N * V);
  }

  // Attention's GEMMs as the cpu kernels run them: per (batch, query
  // head), each block of 64 queries against the keys up to the block's end,
  // hs deep; two products forward (scores, output), five backward (scores
  // again, dP, dV, dQ, dK). The masked half is not counted: it is not run.
  template <auto M, class... A>
  static double executed(Op<M>, const A&...) {
    return 0;
  }
  static double causal_blocks(int T) {
    double sum = 0;
    for (int t0 = 0; t0 < T; t0 += 64) {
      const int rows = std::min(64, T - t0);
      sum += static_cast<double>(rows) * (t0 + rows);
    }
    return sum;
  }
  static double executed(Op<&Kernels::attention_forward>, float*, float*, const float*,
                         const float*, const float*, int B, int T, int NH, int, int hs, int, int) {
    return 2 * 2.0 * B * NH * hs * causal_blocks(T);
  }
  static double executed(Op<&Kernels::attention_backward>, float*, float*, float*, const float*,
                         const float*, const float*, const float*, const float*, const float*,
                         int B, int T, int NH, int, int hs, int, int) {
    return 5 * 2.0 * B * NH * hs * causal_blocks(T);
  }

  // Attention's FLOPs at the least: the causal triangle exactly (T (T+1) / 2
  // scores per (batch, query head)), two products forward and four backward
  // (an implementation that keeps the scores need not recompute them).
  template <auto M, class... A>
  static double needed(Op<M>, const A&...) {
    return 0;
  }
  static double triangle(int T) {
    return 0.5 * T * (T + 1.0);
  }
  static double needed(Op<&Kernels::attention_forward>, float*, float*, const float*, const float*,
                       const float*, int B, int T, int NH, int, int hs, int, int) {
    return 2 * 2.0 * B * NH * hs * triangle(T);
  }
  static double needed(Op<&Kernels::attention_backward>, float*, float*, float*, const float*,
                       const float*, const float*, const float*, const float*, const float*, int B,
                       int T, int NH, int, int hs, int, int) {
    return 4 * 2.0 * B * NH * hs * triangle(T);
  }

  // matmul_forward (out, inp, w, bias, N, C, OC): 2 N C OC FLOPs;
  // matmul_backward (dinp, dw, dbias, dout, inp, w, N, C, OC): dW's 2 N C OC
  // and, when dinp is wanted, as many again. Other ops pass through.
  template <class... A>
  void note_gemm(const char* op, double dt, const A&... x) const {
    constexpr std::size_t n = sizeof...(A);
    if constexpr (n >= 7) {
      const auto t = std::tie(x...);
      using First = std::decay_t<std::tuple_element_t<0, std::tuple<A...>>>;
      using N = std::decay_t<std::tuple_element_t<n - 3, std::tuple<A...>>>;
      using C = std::decay_t<std::tuple_element_t<n - 2, std::tuple<A...>>>;
      using OC = std::decay_t<std::tuple_element_t<n - 1, std::tuple<A...>>>;
      if constexpr (std::is_same_v<N, int> && std::is_same_v<C, int> && std::is_same_v<OC, int> &&
                    std::is_pointer_v<First>) {
        const std::string name = op;
        const bool forward = name == "matmul_forward";
        if (!forward && name != "matmul_backward") return;
        const double nc_oc = 2.0 * std::get<n - 3>(t) * std::get<n - 2>(t) * std::get<n - 1>(t);
        GemmTime& g = gemms[{name, std::get<n - 3>(t), std::get<n - 2>(t), std::get<n - 1>(t)}];
        g.seconds += dt;
        g.flops += forward || std::get<0>(t) == nullptr ? nc_oc : 2 * nc_oc;
        ++g.calls;
      }
    }
  }

  const Kernels& k_;
};

}  // namespace ztrain::bench
