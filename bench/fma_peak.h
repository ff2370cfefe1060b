// fma_peak: the processor's fp32 multiply-add peak, measured, for the
// benchmarks' bound beneath sgemm's rate. Each thread runs independent
// chains of fused multiply-adds held in registers (no memory traffic):
// 16 lanes with AVX-512 F, else 8 with AVX2 FMA, chosen at run time. Twelve
// chains cover an FMA's latency on two pipes (4 cycles x 2 in flight = 8)
// with room, so the loop issues an FMA every cycle each pipe can take one.
// No kernel of the step can run its multiply-adds faster, whatever its GEMM
// library: a step's FLOPs over this rate is the least time it could take.
#pragma once

#include <immintrin.h>

#include <thread>
#include <vector>

#include "stopwatch.h"

namespace ztrain::bench {

namespace fma_detail {

constexpr int kChains = 12;
constexpr long kRounds = 20'000'000;  // about 0.1 s a measurement at 2-3 GHz

// Returns a value that depends on every chain, so none is optimised away.
__attribute__((target("avx512f"))) inline float chains_avx512(long rounds) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
  for (long r = 0; r < rounds; ++r)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], mul, add);
  float lanes[16], sum = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    sum += lanes[0];
  }
  return sum;
}

__attribute__((target("avx2,fma"))) inline float chains_avx2(long rounds) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
  for (long r = 0; r < rounds; ++r)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], mul, add);
  float lanes[8], sum = 0;
  for (int i = 0; i < kChains; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    sum += lanes[0];
  }
  return sum;
}

}  // namespace fma_detail

// The processor's multiply-add peak in FLOP/s on `threads` threads running
// at once (the median of `reps` measurements), and its vector width in
// lanes; {0, 0} where it has neither AVX-512 F nor AVX2 FMA.
struct FmaPeak {
  double flops_per_s = 0;
  int lanes = 0;
};

inline FmaPeak fma_peak(int threads, int reps) {
  const bool wide = __builtin_cpu_supports("avx512f");
  if (!wide && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return {};
  const int lanes = wide ? 16 : 8;
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {  // the first warms the clocks up
    std::vector<std::thread> pool;
    std::vector<float> sink(static_cast<std::size_t>(threads));  // escapes: the chains stay
    const double took = timed([&] {
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&sink, t, wide] {
          sink[static_cast<std::size_t>(t)] = wide ? fma_detail::chains_avx512(fma_detail::kRounds)
                                                   : fma_detail::chains_avx2(fma_detail::kRounds);
        });
      for (auto& th : pool) th.join();
    });
    const double flops = 2.0 * lanes * fma_detail::kChains * fma_detail::kRounds * threads;
    if (r > 0) rates.push_back(flops / took);
  }
  return {median(rates), lanes};
}

}  // namespace ztrain::bench
