// Throughput of the cuda kernels at GPT-2 124M's shapes (B=8, T=1024,
// C=768, 12 heads, vocabulary 50257): each op's forward and backward timed
// with CUDA events (median of 10 after 3 warm-ups), as TFLOP/s for the
// GEMMs and attention (against the card's dense peak given on the command
// line) and GB/s for the memory-bound ops. Prints one table.
//
// usage: bench_cuda_kernels [PEAK_BF16_TFLOPS]   (H100/H200 SXM: 989)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_device.h"

namespace {

using ztrain::Category;
using ztrain::DType;
using ztrain::Fill;
using ztrain::Tier;

double median_ms(ztrain::cuda::CudaDevice& dev, const std::function<void()>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(a, dev.compute());
    f();
    cudaEventRecord(b, dev.compute());
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const double peak = argc > 1 ? std::atof(argv[1]) : 989.0;
  std::string why;
  if (ztrain::cuda::cuda_device_count(&why) == 0) {
    std::printf("no usable GPU: %s\n", why.c_str());
    return 77;
  }
  auto dev_owner = ztrain::cuda::make_cuda_device({});
  auto& dev = static_cast<ztrain::cuda::CudaDevice&>(*dev_owner);
  const auto k = ztrain::cuda::make_cuda_kernels(dev, {true, DType::bf16});
  const auto k32 = ztrain::cuda::make_cuda_kernels(dev, {});
  const std::size_t B = 8, T = 1024, C = 768, NH = 12, hs = 64, V = 50257, N = B * T;
  auto buf = [&](std::size_t bytes) {
    return dev.allocate(Tier::device, Category::activations, bytes, Fill::zeros);
  };
  auto x = buf(4 * N * 4 * C), y = buf(4 * N * 4 * C), dy = buf(4 * N * 4 * C);
  auto w = buf(4 * V * C), dw = buf(4 * V * C);  // up to the lm head (V, C)
  auto logits = buf(4 * N * V);
  auto lse = buf(4 * B * NH * T), loss = buf(4 * N);
  auto tokens = buf(4 * N);
  dev.synchronize();
  std::printf("%s\n", dev.name().c_str());
  std::printf("| op | shape | ms | rate |\n|---|---|---|---|\n");
  auto gemm_row = [&](const char* name, const ztrain::Kernels& kk, DType t, std::size_t OC,
                      bool backward) {
    const ztrain::ConstTypedPtr wp{w.data(), t};
    const double flops = 2.0 * N * C * OC * (backward ? 2 : 1);
    float* out = OC > 4 * C ? logits.as<float>() : y.as<float>();  // (N, OC)
    const double ms = median_ms(dev, [&] {
      if (backward)
        kk.matmul_backward(x.as<float>(), {dw.data(), t}, nullptr, out, x.as<float>(), wp,
                           {N, C, OC});
      else
        kk.matmul_forward(out, x.as<float>(), wp, nullptr, {N, C, OC});
    });
    std::printf("| %s | %zu x %zu x %zu | %.3f | %.0f TFLOP/s (%.0f %% of %.0f) |\n", name, N, C,
                OC, ms, flops / ms / 1e9, 100.0 * flops / ms / 1e9 / peak, peak);
  };
  gemm_row("matmul fwd bf16", *k, DType::bf16, 4 * C, false);
  gemm_row("matmul bwd bf16", *k, DType::bf16, 4 * C, true);
  gemm_row("matmul fwd fp32 (tf32)", *k, DType::f32, 4 * C, false);
  gemm_row("matmul fwd fp32", *k32, DType::f32, 4 * C, false);
  gemm_row("lm head fwd bf16", *k, DType::bf16, V, false);
  // Attention both ways: the fp32 flash kernel (an fp32 run's) and the
  // tensor-core GEMMs on bf16 operands (a bf16 run's).
  for (const auto& [name, ak] : {std::pair{"fp32 flash", k32.get()}, {"bf16 GEMMs", k.get()}}) {
    const float* q = x.as<float>();
    const ztrain::AttentionShape shape{B, T, NH, NH, hs, 3 * C, 3 * C};
    // Causal: half the T x T scores; forward 2 GEMMs, backward 5 (FLOPs as
    // FlashAttention counts them).
    const double fwd_flops = 4.0 * B * NH * T * T * hs / 2;
    const double ms_f = median_ms(dev, [&] {
      ak->attention_forward(y.as<float>(), lse.as<float>(), {q, q + C, q + 2 * C}, shape);
    });
    std::printf("| attention fwd, %s | B %zu T %zu NH %zu hs %zu | %.3f | %.1f TFLOP/s |\n", name,
                B, T, NH, hs, ms_f, fwd_flops / ms_f / 1e9);
    float* d = dy.as<float>();
    const double ms_b = median_ms(dev, [&] {
      ak->attention_backward({d, d + C, d + 2 * C}, y.as<float>(), y.as<float>(),
                             {q, q + C, q + 2 * C}, lse.as<float>(), shape);
    });
    std::printf("| attention bwd, %s | B %zu T %zu NH %zu hs %zu | %.3f | %.1f TFLOP/s |\n", name,
                B, T, NH, hs, ms_b, 2.5 * fwd_flops / ms_b / 1e9);
  }
  auto bytes_row = [&](const char* name, double bytes, const std::function<void()>& f) {
    const double ms = median_ms(dev, f);
    std::printf("| %s | | %.3f | %.0f GB/s |\n", name, ms, bytes / ms / 1e6);
  };
  bytes_row("layernorm fwd", 8.0 * N * C, [&] {
    k->layernorm_forward(y.as<float>(), lse.as<float>(), loss.as<float>(), x.as<float>(),
                         w.as<float>(), w.as<float>(), {N, C}, 1e-5f);
  });
  bytes_row("gelu fwd", 8.0 * N * 4 * C, [&] {
    k->gelu_forward(y.as<float>(), x.as<float>(), w.as<float>(), {N, 4 * C});
  });
  bytes_row("softmax xent fwd", 8.0 * N * V, [&] {
    k->softmax_crossentropy_forward(loss.as<float>(), logits.as<float>(), tokens.as<std::int32_t>(),
                                    {N, V});
  });
  const std::size_t n = 4 * C * C;
  ztrain::Buffer scalars = dev.allocate(Tier::device, Category::grads, sizeof(ztrain::StepScalars));
  const ztrain::StepScalars unit;  // multiplier 1, not skipped
  dev.copy(scalars.data(), &unit, sizeof unit);
  const ztrain::AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.5f};
  const auto adamw = [&](const std::vector<ztrain::AdamWRun>& runs) {
    k->adamw(x.as<float>(), {dw.data(), DType::bf16}, y.as<float>(), dy.as<float>(),
             {w.data(), DType::bf16}, runs.data(), runs.size(), h,
             scalars.as<ztrain::StepScalars>(), ztrain::GradAfter::zeroed);
  };
  const std::vector<ztrain::AdamWRun> one{{0, n, true}};
  bytes_row("adamw (bf16 grads, working copy)", 18.0 * n, [&] { adamw(one); });
  // The same elements as the 148 runs of gpt2-124m's tensors (alternating
  // decay, as weights and biases do): what the run table saves over a
  // launch per tensor.
  std::vector<ztrain::AdamWRun> runs;
  for (std::size_t r = 0; r < 148; ++r)
    runs.push_back({n * r / 148, n * (r + 1) / 148, r % 2 == 0});
  bytes_row("adamw, the same in 148 runs", 18.0 * n, [&] { adamw(runs); });
  return 0;
}
