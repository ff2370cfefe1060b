// TimedKernels: a Kernels decorator that adds up wall time per op, for the
// benchmarks' time split. Each op is timed around the wrapped call.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "kernels/kernel_ops.h"
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
  ZTRAIN_KERNEL_OPS(ZTRAIN_TIMED)
#undef ZTRAIN_TIMED

 private:
  const Kernels& k_;
};

}  // namespace ztrain::bench
