// bench_head_rows: the output head's forward and backward over N tokens,
// as the transformer runs it (head_forward_backward), in chunks of R
// tokens for several R: per chunk the logits GEMM, the softmax and its
// loss, the gradient in place, then d(input) and the weight gradient; the
// whole batch in one chunk is how the head ran before chunks. The sizes
// alternate within each round (noisy machines) and each prints its median
// over the rounds beside the one-chunk time and the chunk's logits.
//
//   build/bin/bench_head_rows [--tokens N] [--width C] [--vocab V] [--rounds K]
//                             [--threads T] [ROWS...]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "stopwatch.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

using namespace ztrain;

namespace {

struct Head {
  int N, C, V;
  std::vector<float> lnf, w, dw, dlnf, logits, losses;
  std::vector<std::int32_t> targets;
};

// One head forward and backward in chunks of `rows` tokens.
void run_head(const Kernels& k, Head& h, int rows) {
  const float dloss = 1.0f / static_cast<float>(h.N);
  for (int r0 = 0; r0 < h.N; r0 += rows) {
    const int n = std::min(h.N, r0 + rows) - r0;
    const std::size_t at = static_cast<std::size_t>(r0) * h.C;
    const std::size_t nr = static_cast<std::size_t>(n), C = static_cast<std::size_t>(h.C),
                      V = static_cast<std::size_t>(h.V);
    const float* x = h.lnf.data() + at;
    k.matmul_forward(h.logits.data(), x, h.w.data(), nullptr, {nr, C, V});
    k.softmax_crossentropy_forward(h.losses.data() + r0, h.logits.data(), h.targets.data() + r0,
                                   {nr, V});
    k.softmax_crossentropy_backward(h.logits.data(), h.targets.data() + r0, dloss, {nr, V});
    k.matmul_backward(h.dlnf.data() + at, h.dw.data(), nullptr, h.logits.data(), x, h.w.data(),
                      {nr, C, V});
  }
}

}  // namespace

int main(int argc, char** argv) {
  int N = 8192, C = 768, V = 50257, rounds = 3, threads = 2;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    auto value = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--tokens"))
      N = value();
    else if (!std::strcmp(argv[i], "--width"))
      C = value();
    else if (!std::strcmp(argv[i], "--vocab"))
      V = value();
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = value();
    else if (!std::strcmp(argv[i], "--threads"))
      threads = value();
    else
      sizes.push_back(std::atoi(argv[i]));
  }
  if (sizes.empty()) sizes = {256, 320, 640, 1280, 2560, N};
  auto device = make_cpu_device(threads);
  const auto kernels = make_cpu_kernels();
  int largest = 0;
  for (int r : sizes) largest = std::max(largest, std::min(r, N));
  Head h{N, C, V, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  h.lnf.resize(static_cast<std::size_t>(N) * C);
  for (auto& x : h.lnf) x = normal(rng);
  h.w.resize(static_cast<std::size_t>(V) * C);
  for (auto& x : h.w) x = 0.02f * normal(rng);
  h.dw.assign(h.w.size(), 0.0f);
  h.dlnf.assign(h.lnf.size(), 0.0f);
  h.logits.resize(static_cast<std::size_t>(largest) * V);
  h.losses.resize(static_cast<std::size_t>(N));
  h.targets.resize(static_cast<std::size_t>(N));
  for (auto& t : h.targets) t = static_cast<std::int32_t>(rng() % static_cast<unsigned>(V));
  run_head(*kernels, h, sizes.front());  // warm-up: pages touched
  std::vector<std::vector<double>> times(sizes.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t s = 0; s < sizes.size(); ++s)
      times[s].push_back(bench::timed([&] { run_head(*kernels, h, sizes[s]); }));
  const double whole = bench::median(times.back());
  std::printf("head forward + backward, N=%d C=%d V=%d, %d threads, median of %d rounds\n", N, C, V,
              threads, rounds);
  std::printf("  %8s %8s %12s %14s %12s\n", "rows", "chunks", "seconds", "logits (MiB)",
              "/ last row");
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const int rows = std::min(sizes[s], N);
    const double t = bench::median(times[s]);
    std::printf("  %8d %8d %12.3f %14.1f %12.3f\n", rows, (N + rows - 1) / rows, t,
                static_cast<double>(rows) * V * 4 / 1048576.0, t / whole);
  }
  return 0;
}
