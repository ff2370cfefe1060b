// AdamW over a shard in one pass (master, moments, gradient, the 16-bit
// working copy), for all of a shard's runs at once: a run table travels in
// the kernel's parameters, kRunsPerLaunch runs per launch, so a shard of a
// few hundred tensors costs a few launches, not a few hundred. The step's
// multiplier and skip flag are read from device memory (StepScalars), so
// the update is queued behind the norm without the host reading it.
#include "cuda/cuda_kernels.h"
#include "cuda/kernels/common.cuh"

namespace ztrain::cuda {
namespace {

constexpr unsigned kThreads = 256;
// Runs per launch: 64 runs of begin, end and whether they decay are 1.1 KB
// of the 4 KB a kernel's parameters may take on every supported
// architecture.
constexpr int kRunsPerLaunch = 64;

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay, l2, bc1, bc2;
  bool zero_grad;
};

// Ascending, non-overlapping runs [begin[r], end[r]) of the shard.
struct RunBatch {
  std::uint64_t begin[kRunsPerLaunch], end[kRunsPerLaunch];
  bool decay[kRunsPerLaunch];
  int count;
};

// p, m, v: the shard's fp32 arrays; g: of type G; working: of type W or
// null. Elements between runs are not touched. The update is the cpu
// reference's, term for term. Each thread walks its elements upwards, so
// its run index only ever advances.
template <class G, class W>
__global__ void adamw_kernel(float* p, G* g, float* m, float* v, W* working, RunBatch runs,
                             AdamParams a, const StepScalars* s) {
  const bool skip = s->skip != 0;
  const float grad_mult = s->grad_mult;
  const std::uint64_t hi = runs.end[runs.count - 1];
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  int r = 0;
  for (std::uint64_t i =
           runs.begin[0] + blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
       i < hi; i += stride) {
    while (i >= runs.end[r]) ++r;  // i < hi = the last run's end
    if (i < runs.begin[r]) continue;
    if (skip) {
      g[i] = from_f32<G>(0.0f);
      continue;
    }
    const float wd = runs.decay[r] ? a.weight_decay : 0.0f;
    const float l2 = runs.decay[r] ? a.l2 : 0.0f;
    const float gi = to_f32(g[i]) * grad_mult + l2 * p[i];
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / a.bc1;
    const float vhat = vi / a.bc2;
    const float pi = p[i] - a.lr * (wd * p[i] + mhat / (sqrtf(vhat) + a.eps));
    p[i] = pi;
    if (a.zero_grad) g[i] = from_f32<G>(0.0f);
    if (working) working[i] = from_f32<W>(pi);
  }
}

}  // namespace

void CudaKernels::adamw(float* p, TypedPtr g, float* m, float* v, TypedPtr working,
                        const AdamWRun* runs, std::size_t run_count, const AdamWHyper& h,
                        const StepScalars* s, GradAfter grad_after) const {
  const AdamParams a{h.lr,  h.beta1,        h.beta2,
                     h.eps, h.weight_decay, h.l2,
                     h.bc1, h.bc2,          grad_after == GradAfter::zeroed};
  // Without a working copy the kernel is instantiated with W = float and
  // a null pointer.
  const DType wt = working ? working.dtype : DType::f32;
  std::size_t r = 0;
  while (r < run_count) {
    RunBatch batch{};
    for (; r < run_count && batch.count < kRunsPerLaunch; ++r) {
      if (runs[r].end <= runs[r].begin) continue;
      batch.begin[batch.count] = runs[r].begin;
      batch.end[batch.count] = runs[r].end;
      batch.decay[batch.count] = runs[r].decay;
      ++batch.count;
    }
    if (batch.count == 0) return;
    const std::uint64_t span = batch.end[batch.count - 1] - batch.begin[0];
    with_type(g.dtype, [&](auto gtag) {
      using G = decltype(gtag);
      with_type(wt, [&](auto wtag) {
        using W = decltype(wtag);
        adamw_kernel<G, W><<<blocks_for(span, kThreads), kThreads, 0, stream_>>>(
            p, static_cast<G*>(g.data), m, v, static_cast<W*>(working.data), batch, a, s);
      });
    });
    ZTRAIN_CUDA_LAUNCHED();
  }
}

}  // namespace ztrain::cuda
