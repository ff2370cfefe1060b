// bench_adamw: the CPU AdamW against the machine's memory bandwidth,
// measured in the same process.
//
// One AdamW step over n fp32 elements reads the master weights, the
// gradient, m and v and writes the masters, m and v: 28 bytes per element
// where the gradient is kept (the sharded strategies' case: the next
// step's reduction overwrites it), 32 where it is also zeroed (ddp and
// zero1, whose backward accumulates into it), 2 more when it also writes
// a bf16 working copy. A kernel bound by memory bandwidth runs at the
// rate of a plain streaming loop that moves the same bytes, which the
// bench measures in the same rounds: p += g, m += g, v += g, g = 0 over the
// same four arrays, 16 bytes read and 16 written per element, with no
// arithmetic to speak of. Prints ns per element and GB/s of the fast
// kernel (each variant), of the reference kernel, and of the stream, in
// alternating rounds; medians. Where the fast kernel runs the AVX-512 loop,
// the AVX2 loop is timed too, in the same chunks.
//
//   build/bin/bench_adamw [--n 1e8] [--threads 2] [--rounds 5]
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/reference_kernels.h"
#include "kernels/cpu/vector_math.h"
#include "stopwatch.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

using namespace ztrain;
using bench::median;
using bench::timed;

int main(int argc, char** argv) {
  std::size_t n = 100000000;
  int threads = 2, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = static_cast<std::size_t>(std::atof(argv[i + 1]));
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    if (a == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  auto device = make_cpu_device(threads);  // sets oneTBB's and OpenBLAS's threads
  const auto fast = make_cpu_kernels();
  const auto reference = make_reference_cpu_kernels();
  auto buffer = [&](std::size_t bytes) {
    return device->allocate(Tier::host, Category::optimizer, bytes);
  };
  Buffer p = buffer(n * 4), g = buffer(n * 4), m = buffer(n * 4), v = buffer(n * 4),
         w = buffer(n * 2);
  // Touch everything once, with values AdamW moves.
  oneapi::tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) {
    p.as<float>()[i] = 0.02f * static_cast<float>(i % 97) - 1.0f;
    m.as<float>()[i] = 0.0f;
    v.as<float>()[i] = 0.0f;
  });
  const auto refill_grads = [&] {
    oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, n, 1 << 16),
                              [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                                for (std::size_t i = r.begin(); i < r.end(); ++i)
                                  g.as<float>()[i] = 1e-3f * static_cast<float>(i % 13);
                              });
  };
  const StepScalars scalars;  // multiplier 1, not skipped
  const AdamWRun all{0, n, true};
  const auto step = [&](const Kernels& k, TypedPtr working, GradAfter after, int t) {
    const AdamWHyper h{1e-3f,
                       0.9f,
                       0.95f,
                       1e-8f,
                       0.1f,
                       1.0f - std::pow(0.9f, static_cast<float>(t)),
                       1.0f - std::pow(0.95f, static_cast<float>(t))};
    k.adamw(p.as<float>(), {g.data(), DType::f32}, m.as<float>(), v.as<float>(), working, &all, 1,
            h, &scalars, after);
  };
  // The stream: AdamW's bytes without its arithmetic.
  const auto stream = [&] {
    oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, n, 1 << 16),
                              [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
                                float* a = p.as<float>();
                                float* b = m.as<float>();
                                float* c = v.as<float>();
                                float* d = g.as<float>();
                                for (std::size_t i = r.begin(); i < r.end(); ++i) {
                                  a[i] += d[i];
                                  b[i] += d[i];
                                  c[i] += d[i];
                                  d[i] = 0.0f;
                                }
                              });
  };
  // The AVX2 loop in the fast kernel's chunks, for a machine that has both.
  const auto step_avx2 = [&](int t) {
    oneapi::tbb::parallel_for(
        oneapi::tbb::blocked_range<std::size_t>(0, (n + 7) / 8, 65536 / 8),
        [&](const oneapi::tbb::blocked_range<std::size_t>& r) {
          const std::size_t a = r.begin() * 8, b = std::min(n, r.end() * 8);
          const vec::AdamScalars s{1e-3f,
                                   0.9f,
                                   0.95f,
                                   1e-8f,
                                   0.1f,
                                   0.0f,
                                   1.0f,
                                   1.0f - std::pow(0.9f, static_cast<float>(t)),
                                   1.0f - std::pow(0.95f, static_cast<float>(t))};
          vec::adamw_avx2(p.as<float>() + a, {g.as<float>() + a, DType::f32}, m.as<float>() + a,
                          v.as<float>() + a, nullptr, b - a, s, false);
        });
  };
  const bool both = vec::have_avx512() && vec::have_avx2_fma();
  const TypedPtr bf16{w.data(), DType::bf16};
  std::vector<double> t_kept, t_zeroed, t_kept16, t_ref, t_stream, t_avx2;
  int t = 1;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    refill_grads();
    const double a = timed([&] { step(*fast, {}, GradAfter::kept, t++); });
    const double b = timed([&] { step(*fast, {}, GradAfter::zeroed, t++); });
    refill_grads();
    const double c = timed([&] { step(*fast, bf16, GradAfter::kept, t++); });
    const double d = timed([&] { step(*reference, {}, GradAfter::zeroed, t++); });
    const double e = timed(stream);
    const double f = both ? timed([&] { step_avx2(t++); }) : 0.0;
    if (r == 0) continue;
    t_avx2.push_back(f);
    t_kept.push_back(a);
    t_zeroed.push_back(b);
    t_kept16.push_back(c);
    t_ref.push_back(d);
    t_stream.push_back(e);
  }
  const double dn = static_cast<double>(n);
  const double bw = 32.0 * dn / median(t_stream);
  std::printf("AdamW over %zu fp32 elements, %d threads, medians of %d rounds\n", n, threads,
              rounds);
  std::printf("stream (16 B read + 16 B written per element): %.3f ns/element, %.1f GB/s\n",
              median(t_stream) / dn * 1e9, bw / 1e9);
  const auto row = [&](const char* name, const std::vector<double>& ts, double bytes) {
    const double s = median(ts);
    std::printf("%-34s %.3f ns/element  %.1f GB/s  %.0f%% of the stream's bandwidth\n", name,
                s / dn * 1e9, bytes * dn / s / 1e9, 100.0 * bytes * dn / s / bw);
  };
  row("fast kernel, fp32, g kept (28 B)", t_kept, 28);
  if (both) row("  its AVX2 loop, g kept (28 B)", t_avx2, 28);
  row("fast kernel, fp32, g zeroed (32 B)", t_zeroed, 32);
  row("fast kernel, g kept, + bf16 working", t_kept16, 30);
  row("reference kernel, fp32, g zeroed", t_ref, 32);
  return 0;
}
