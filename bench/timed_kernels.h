// TimedKernels: a Kernels decorator that adds up wall time per op, for the
// benchmarks' time split. Each op is timed around the wrapped call; the
// matmuls are also kept by shape (N, C, OC) with their FLOPs, so a
// benchmark can set each shape's rate beside sgemm's at that shape.
#pragma once

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

#define ZTRAIN_TIMED(name, params, args)                                              \
  void name params const override {                                                   \
    const auto t0 = std::chrono::steady_clock::now();                                 \
    k_.name args;                                                                     \
    const double dt =                                                                 \
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); \
    seconds[#name] += dt;                                                             \
    [&](const auto&... x) { note_gemm(#name, dt, x...); } args;                       \
  }
  ZTRAIN_KERNEL_OPS(ZTRAIN_TIMED)
#undef ZTRAIN_TIMED

 private:
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
