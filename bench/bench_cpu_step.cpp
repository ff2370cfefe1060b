// bench_cpu_step: how close a full training step (forward, backward,
// optimizer) gets to the machine's own sgemm rate, measured in the same
// process. Prints one table per model, the time split by op, the matmuls
// against sgemm at their own shapes, and the memory-bound ops against a
// stream's bandwidth (STREAM's triad, measured in the same process); then
// the step against its roofline (those rates), and against the bound no
// implementation can pass: its least FLOPs at the processor's measured
// multiply-add peak (fma_peak.h).
// --precision: gpt2-124m in bf16 against fp32 instead, in alternating
// rounds; the 16-bit conversions' cost is what the ops that read or write
// 16-bit parameters and gradients (matmuls, embeddings, norms, the
// optimizer) take beyond their fp32 twins, as a share of the bf16 step.
//
// --model M (a configs/models preset, a TOML file's [model] or a Hugging
// Face directory) with --batch B and --seq T measures that shape alone;
// without it, gpt2-124m at 4x64 and gpt2-tiny at 8x256.
//
//   build/bin/bench_cpu_step [--threads N] [--steps N] [--precision [--rounds N]]
//                            [--model M [--batch B] [--seq T]]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <oneapi/tbb/parallel_for.h>

#include "config/config.h"
#include "config/hf_model_import.h"
#include "fma_peak.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/block_gemm.h"
#include "loader/plugin_loader.h"
#include "stopwatch.h"
#include "timed_kernels.h"
#include "train/trainer.h"

using namespace ztrain;
using Clock = std::chrono::steady_clock;
using bench::median;

namespace {

double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median of several runs of C (M,N) = A (M,K) B^T with the device's threads
// (the median on both sides of the ratio: a noisy neighbour moves neither).
double sgemm_rate(std::size_t M, std::size_t N, std::size_t K, int reps) {
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    blas::sgemm(blas::Op::none, blas::Op::transpose, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f,
                c.data(), N);
    if (r > 0)
      rates.push_back(2.0 * double(M) * double(N) * double(K) /
                      seconds(t0));  // the first call warms up
  }
  return median(rates);
}

// Bytes a second of `pass`, which moves `bytes` over arrays far past the
// caches: the median of `reps` passes after a warm-up.
template <class Pass>
double pass_rate(double bytes, int reps, Pass&& pass) {
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    pass();
    if (r > 0) rates.push_back(bytes / seconds(t0));
  }
  return median(rates);
}

// f(i) for i in [0, n) on the device's threads.
template <class F>
void each_element(std::size_t n, F&& f) {
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::size_t>(0, n, 1 << 16),
                            [&](const oneapi::tbb::blocked_range<std::size_t>& x) {
                              for (std::size_t i = x.begin(); i < x.end(); ++i) f(i);
                            });
}

constexpr std::size_t kStreamFloats = std::size_t{1} << 25;  // 128 MiB an array

// STREAM's triad, a = b + s c over three arrays of 2^25 floats, on the
// device's threads: bytes counted as STREAM counts them (12 per element).
double stream_rate(int reps) {
  const std::size_t n = kStreamFloats;
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  return pass_rate(12.0 * static_cast<double>(n), reps,
                   [&] { each_element(n, [&](std::size_t i) { a[i] = b[i] + 3.0f * c[i]; }); });
}

// The in-place stream a += 3 b over two such arrays: 12 bytes an element
// (a read and written, b read), the pattern of AdamW's p, m, v and g,
// whose written lines were read first (the triad's writes cost a read the
// triad does not count).
double update_rate(int reps) {
  const std::size_t n = kStreamFloats;
  std::vector<float> a(n, 0.0f), b(n, 1.0f);
  return pass_rate(12.0 * static_cast<double>(n), reps,
                   [&] { each_element(n, [&](std::size_t i) { a[i] += 3.0f * b[i]; }); });
}

const char* const kGpt2_124m =
    "[model]\narch = \"gpt2\"\nn_layer = 12\nn_head = 12\nn_embd = 768\nvocab_size = 50257\n"
    "seq_len = 64\n";

// A model to time: its [model] table (preset name, run file or Hugging
// Face directory through --model, else TOML text), batch and sequence.
struct BenchModel {
  std::string name;
  std::string toml;        // [model] keys; empty: `preset` names it
  std::string preset;      // --model's argument
  int batch = 4, seq = 0;  // seq 0: the model's seq_len
};

// The run of `m` at `precision` on `threads`: the model, the synthetic
// source, the default strategy (ddp at one rank).
Run assemble_bench(const BenchModel& m, int threads, const char* precision) {
  std::vector<std::string> sets = {"train.micro_batch_size=" + std::to_string(m.batch),
                                   "train.precision=\"" + std::string(precision) + "\"",
                                   "device.threads=" + std::to_string(threads),
                                   "data.plugin=\"synthetic\""};
  if (m.seq > 0) sets.push_back("model.seq_len=" + std::to_string(m.seq));
  const PluginLoader loader(default_plugin_dirs({}), nullptr);
  if (m.preset.empty()) {
    RunConfig c = RunConfig::parse(m.toml, m.name);
    for (const auto& o : sets) c.override_with(o);
    return assemble(c, loader);
  }
  // A run file of its own, so that --model finds presets as ztrain does.
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     ("bench_cpu_step_" + std::to_string(::getpid()) + ".toml");
  { std::ofstream(file) << "[model]\nplugin = \"transformer\"\n"; }
  TrainArgs args;
  args.config = file;
  args.model = m.preset;
  args.overrides = sets;
  RunConfig c = load_run_config(args);
  std::filesystem::remove(file);
  resolve_model_dir(c);
  return assemble(c, loader);
}

// Seconds per step: the median step, and each op's mean; the matmuls by
// shape (totals over the timed steps).
struct StepTimes {
  double step = 0, total = 0, optimizer = 0;
  std::map<std::string, double> ops;
  ModelInfo info;
  std::map<bench::GemmShape, bench::GemmTime> gemms;
  std::map<std::string, double> bytes;  // memory-bound ops' bytes per step
  std::map<std::string, double> flops;  // attention's executed FLOPs per step
  std::map<std::string, double> least;  // attention's least FLOPs per step
};

StepTimes measure(const BenchModel& m, int threads, int steps, const char* precision) {
  Run r = assemble_bench(m, threads, precision);
  const ModelInfo info = r.model->info();
  const int B = m.batch, T = info.seq_len;
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (int b = 0; b < B; ++b)
    r.data->fill(Split::train, static_cast<std::uint64_t>(b), in.data() + b * T, tg.data() + b * T);
  const Batch batch{{B, T}, in.data(), tg.data()};
  const auto params = r.model->params();
  Arena arena(*r.device);
  bench::TimedKernels timed(*r.kernels);
  LossSum losses(*r.device, timed);
  double total = 0, optimizer = 0;
  std::vector<double> step_times;
  for (int s = -2; s < steps; ++s) {  // two warm-up steps
    if (s == 0) timed.reset();
    const auto t0 = Clock::now();
    r.strategy->begin_micro_step(true);
    StepContext ctx(*r.strategy, params, timed, arena, losses,
                    1.0f / static_cast<float>(in.size()));  // the mean loss's gradient
    r.model->forward_backward(batch, ctx);
    losses.take();
    const auto t1 = Clock::now();
    r.strategy->step({1e-4, s + 3, 1.0, 1.0});
    if (s >= 0) {
      optimizer += seconds(t1);
      total += seconds(t0);
      step_times.push_back(seconds(t0));
    }
  }
  StepTimes t{
      median(step_times), total / steps, optimizer / steps, {}, info, timed.gemms, {}, {}, {}};
  for (const auto& [op, sec] : timed.seconds) t.ops[op] = sec / steps;
  for (const auto& [op, b] : timed.bytes) t.bytes[op] = b / steps;
  for (const auto& [op, f] : timed.flops) t.flops[op] = f / steps;
  for (const auto& [op, f] : timed.least) t.least[op] = f / steps;
  return t;
}

// The step's matmuls against sgemm at their own shapes (out (N, OC) = inp
// (N, C) W^T, the forward's form, stands for the backward's two products
// too): each shape's rate, sgemm's there, and the time the matmuls would
// take at sgemm's rates against the time they took. The step's share of
// one 2048^3 sgemm rate mixes shapes that BLAS runs at different speeds;
// this is the roofline of its largest part. Returns the seconds a step's
// matmuls would take at those rates.
double gemm_roofline(const StepTimes& t, int steps) {
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, double> rate_at;
  double took = 0, at_sgemm = 0;
  std::printf("  matmuls against sgemm at their shapes (out N x OC = N x C by (OC x C)^T):\n");
  for (const auto& [shape, g] : t.gemms) {
    const auto& [op, N, C, OC] = shape;
    double& rate = rate_at[{N, C, OC}];
    if (rate == 0) rate = sgemm_rate(N, OC, C, 5);
    const double achieved = g.flops / g.seconds;
    took += g.seconds / steps;
    at_sgemm += g.flops / rate / steps;
    std::printf(
        "    %-16s N=%5zu C=%5zu OC=%5zu  %6.2f ms/step  %6.1f GFLOP/s  sgemm %6.1f  %5.1f %%\n",
        op.c_str(), N, C, OC, 1e3 * g.seconds / steps, achieved / 1e9, rate / 1e9,
        100.0 * achieved / rate);
  }
  if (took > 0)
    std::printf("    all matmuls: %.1f ms/step, %.1f ms at sgemm's rate for each shape: %.1f %%\n",
                1e3 * took, 1e3 * at_sgemm, 100.0 * at_sgemm / took);
  return at_sgemm;
}

// The memory-bound ops against the stream: each op's bandwidth (the bytes
// it must move over its time) and the share of the stream's it reaches;
// the sum, the time they would take at the stream's rate against the time
// they took. Above 100 %: the operands were still in the caches (small
// activations), so the stream is not their bound. Returns the seconds
// they would take at the stream's rate.
double stream_roofline(const StepTimes& t, double stream) {
  double took = 0, at_stream = 0;
  std::printf("  memory-bound ops against the stream (%.1f GB/s):\n", stream / 1e9);
  for (const auto& [op, b] : t.bytes) {
    const double sec = t.ops.at(op);
    took += sec;
    at_stream += b / stream;
    std::printf("    %-30s %7.2f ms/step  %8.1f MB  %6.1f GB/s  %6.1f %%\n", op.c_str(), 1e3 * sec,
                b / 1e6, b / sec / 1e9, 100.0 * b / sec / stream);
  }
  if (took > 0)
    std::printf("    all of them: %.1f ms/step, %.1f ms at the stream's rate: %.1f %%\n",
                1e3 * took, 1e3 * at_stream, 100.0 * at_stream / took);
  return at_stream;
}

// AdamW over fp32 state moves 36 bytes a parameter: p, g, m and v read
// and written, and g read once more for the gradient norm.
constexpr double kAdamBytesPerParam = 36;

// The step against its roofline: the time it would take with every matmul
// at sgemm's rate for its shape, attention's executed GEMMs at the 2048^3
// rate, the memory-bound ops at the triad's rate and AdamW at the in-place
// stream's. The glue (zeroing, hooks) counts as nothing. Each rate is
// measured apart from the step, so the step can beat its roofline by their
// noise (a few per cent); the share is the goal's yardstick, where the
// 2048^3 rate alone mixes shapes BLAS runs at different speeds and counts
// attention's masked half.
void step_roofline(const StepTimes& t, double gemms, double memory, double sgemm, double update) {
  double attention = 0;
  for (const auto& [op, f] : t.flops) attention += f / sgemm;
  const double adam = kAdamBytesPerParam * static_cast<double>(t.info.n_params) / update;
  const double bound = gemms + attention + memory + adam;
  std::printf(
      "  step against its roofline: %.1f ms (matmuls %.1f at sgemm's rate for their shapes, "
      "attention's executed GEMMs %.1f at the 2048^3 rate, memory-bound ops %.1f at the triad's, "
      "AdamW %.1f at the in-place stream's) = %.1f %% of the step\n",
      1e3 * bound, 1e3 * gemms, 1e3 * attention, 1e3 * memory, 1e3 * adam, 100.0 * bound / t.step);
}

// The step at the processor's multiply-add peak: its least FLOPs (the
// matmuls as run, attention's exact causal triangle with no recomputation)
// at the FMA loop's rate, everything else free. No implementation on this
// machine steps faster, whatever its GEMM library; a peer's step over this
// is the most any ratio against it can be.
void step_bound(const StepTimes& t, int steps, const bench::FmaPeak& peak) {
  if (peak.lanes == 0) return;
  double matmuls = 0, attention = 0;
  for (const auto& [shape, g] : t.gemms) matmuls += g.flops / steps;
  for (const auto& [op, f] : t.least) attention += f;
  const double bound = (matmuls + attention) / peak.flops_per_s;
  std::printf(
      "  step at the FMA peak: %.1f ms (its least FLOPs, %.2f G: matmuls %.2f G and attention's "
      "causal triangle %.2f G, at %.1f GFLOP/s; all else free) = %.1f %% of the step\n",
      1e3 * bound, (matmuls + attention) / 1e9, matmuls / 1e9, attention / 1e9,
      peak.flops_per_s / 1e9, 100.0 * bound / t.step);
}

void run(const BenchModel& m, int threads, int steps, double sgemm, double stream, double update,
         const bench::FmaPeak& peak) {
  const StepTimes t = measure(m, threads, steps, "fp32");
  const ModelInfo& info = t.info;
  const int B = m.batch, T = info.seq_len;
  const double step = t.step;
  const double flops = info.train_flops_per_token * B * T / step;
  std::printf("\n%s: %.1fM params, B=%d T=%d, %d threads, %d steps\n", m.name.c_str(),
              static_cast<double>(info.n_params) / 1e6, B, T, threads, steps);
  std::printf("  step time        %8.3f s (median)\n", step);
  std::printf("  tokens/s         %8.0f\n", B * T / step);
  std::printf("  model FLOP/s     %8.1f G  (6N + 12LCT per token)\n", flops / 1e9);
  std::printf("  of sgemm rate    %8.1f %%\n", 100.0 * flops / sgemm);
  std::printf("  time split:\n");
  std::vector<std::pair<double, std::string>> split;
  double kernels = 0;
  for (const auto& [op, sec] : t.ops) {
    split.emplace_back(sec, op);
    kernels += sec;
  }
  split.emplace_back(t.optimizer, "optimizer step (grad norm, AdamW)");
  split.emplace_back(t.total - t.optimizer - kernels, "other (hooks, zeroing, model glue)");
  std::sort(split.rbegin(), split.rend());
  for (const auto& [sec, op] : split)
    std::printf("    %-36s %6.1f %%  %8.2f ms/step\n", op.c_str(), 100.0 * sec / t.total,
                1e3 * sec);
  const double gemms = gemm_roofline(t, steps);
  const double memory = stream_roofline(t, stream);
  step_roofline(t, gemms, memory, sgemm, update);
  step_bound(t, steps, peak);
}

// The matmuls of one gpt2-124m step (N = 256 rows) alone, fp32 and bf16
// weights and gradients alternating, best of `reps`: a steadier view of
// the conversions' cost than the step's noisy per-op means.
double matmul_precision(const Kernels& k, int reps) {
  struct Shape {
    const char* what;
    std::size_t C, OC;
    int per_step;
  };
  const Shape shapes[] = {{"qkv", 768, 2304, 12},
                          {"attention proj", 768, 768, 12},
                          {"mlp fc", 768, 3072, 12},
                          {"mlp proj", 3072, 768, 12},
                          {"lm head", 768, 50257, 1}};
  const std::size_t N = 256;
  double f32_total = 0, bf16_total = 0;
  std::printf("  matmuls alone (N=%zu, forward + backward, best of %d):\n", N, reps);
  for (const auto& sh : shapes) {
    const std::size_t wn = sh.OC * sh.C;
    const MatmulShape shape{N, sh.C, sh.OC};
    std::vector<float> inp(N * sh.C, 0.5f), w(wn, 0.01f), dw(wn, 0.0f), out(N * sh.OC),
        dout(out.size(), 0.001f), dinp(inp.size());
    std::vector<std::uint16_t> w16(wn), dw16(wn, 0);
    convert(w.data(), DType::f32, w16.data(), DType::bf16, wn);
    double t32 = 1e30, t16 = 1e30;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      k.matmul_forward(out.data(), inp.data(), w.data(), nullptr, shape);
      k.matmul_backward(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), shape);
      t32 = std::min(t32, seconds(t0));
      t0 = Clock::now();
      const ConstTypedPtr wb(w16.data(), DType::bf16);
      k.matmul_forward(out.data(), inp.data(), wb, nullptr, shape);
      k.matmul_backward(dinp.data(), TypedPtr(dw16.data(), DType::bf16), nullptr, dout.data(),
                        inp.data(), wb, shape);
      t16 = std::min(t16, seconds(t0));
    }
    f32_total += sh.per_step * t32;
    bf16_total += sh.per_step * t16;
    std::printf("    %-16s C=%4zu OC=%5zu  fp32 %7.2f ms  bf16 %7.2f ms  (x%.3f)\n", sh.what, sh.C,
                sh.OC, 1e3 * t32, 1e3 * t16, t16 / t32);
  }
  std::printf("    per step: fp32 %.0f ms, bf16 %.0f ms\n", 1e3 * f32_total, 1e3 * bf16_total);
  return bf16_total - f32_total;
}

// bf16 against fp32, alternating so that a slow minute hits both.
void compare_precision(const BenchModel& m, int threads, int steps, int rounds) {
  std::vector<double> s32, s16;
  std::map<std::string, double> ops32, ops16;
  double total16 = 0, opt32 = 0, opt16 = 0;
  int T = 0;
  for (int r = 0; r < rounds; ++r) {
    const StepTimes a = measure(m, threads, steps, "fp32");
    const StepTimes b = measure(m, threads, steps, "bf16");
    s32.push_back(a.step);
    s16.push_back(b.step);
    for (const auto& [op, sec] : a.ops) ops32[op] += sec / rounds;
    for (const auto& [op, sec] : b.ops) ops16[op] += sec / rounds;
    opt32 += a.optimizer / rounds;
    opt16 += b.optimizer / rounds;
    total16 += b.total / rounds;
    T = a.info.seq_len;
    std::printf("round %d: step %.3f s fp32, %.3f s bf16\n", r + 1, a.step, b.step);
  }
  const double tokens = static_cast<double>(m.batch) * T;
  const double t32 = median(s32), t16 = median(s16);
  std::printf("\n%s, B=%d T=%d, %d threads, %d rounds of %d steps (medians)\n", m.name.c_str(),
              m.batch, T, threads, rounds, steps);
  std::printf("  tokens/s fp32    %8.0f\n  tokens/s bf16    %8.0f\n  bf16 / fp32      %8.3f\n",
              tokens / t32, tokens / t16, t32 / t16);
  std::printf("  ops reading or writing 16-bit operands, bf16 minus fp32 (ms/step):\n");
  double extra = 0;
  for (const char* op :
       {"matmul_forward", "matmul_backward", "embedding_forward", "embedding_backward",
        "layernorm_forward", "add_layernorm_forward", "layernorm_backward"}) {
    const double d = ops16[op] - ops32[op];
    extra += d;
    std::printf("    %-22s %8.2f  (%.2f -> %.2f)\n", op, 1e3 * d, 1e3 * ops32[op], 1e3 * ops16[op]);
  }
  const double dopt = opt16 - opt32;
  extra += dopt;
  std::printf("    %-22s %8.2f  (%.2f -> %.2f)\n", "optimizer step", 1e3 * dopt, 1e3 * opt32,
              1e3 * opt16);
  std::printf("  16-bit conversion cost: %.1f %% of the bf16 step\n", 100.0 * extra / total16);
  const double added = matmul_precision(*make_cpu_kernels(), 9);
  std::printf("  16-bit matmul conversions alone: %.0f ms, %.1f %% of the bf16 step\n", 1e3 * added,
              100.0 * added / t16);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 7, rounds = 3;
  bool precision = false;
  BenchModel chosen;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--precision"))
      precision = true;
    else if (i + 1 < argc && !std::strcmp(argv[i], "--model"))
      chosen.name = chosen.preset = argv[++i];
    else if (i + 1 < argc && !std::strcmp(argv[i], "--batch"))
      chosen.batch = std::atoi(argv[++i]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--seq"))
      chosen.seq = std::atoi(argv[++i]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[++i]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[++i]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[++i]);
  }
  try {
    auto device = make_cpu_device(threads);  // sets the BLAS and TBB thread counts
    std::printf("GEMMs: %s\n", blas::report().line().c_str());
    if (const std::string w = blas::report().warning(); !w.empty()) std::printf("%s\n", w.c_str());
    std::printf("attention's block products: %s\n", vec::block_gemm_name());
    if (precision) {
      compare_precision({"gpt2-124m", kGpt2_124m, "", 4, 0}, threads, steps, rounds);
      return 0;
    }
    const double rate = sgemm_rate(2048, 2048, 2048, 7);
    std::printf("sgemm rate (2048^3, %d threads, median of 7): %.1f GFLOP/s\n", threads,
                rate / 1e9);
    const bench::FmaPeak peak = bench::fma_peak(threads, 5);
    if (peak.lanes > 0)
      std::printf(
          "FMA peak (%d lanes, %d threads, median of 5): %.1f GFLOP/s; sgemm is %.1f %% of it\n",
          peak.lanes, threads, peak.flops_per_s / 1e9, 100.0 * rate / peak.flops_per_s);
    const double stream = stream_rate(7);
    std::printf("stream triad (3 x 128 MiB, %d threads, median of 7): %.1f GB/s\n", threads,
                stream / 1e9);
    const double update = update_rate(7);
    std::printf("in-place stream (2 x 128 MiB, %d threads, median of 7): %.1f GB/s\n", threads,
                update / 1e9);
    if (!chosen.preset.empty()) {
      run(chosen, threads, steps, rate, stream, update, peak);
      return 0;
    }
    const BenchModel models[] = {
        {"gpt2-124m", kGpt2_124m, "", 4, 0},
        {"gpt2-tiny",
         "[model]\narch = \"gpt2\"\nn_layer = 4\nn_head = 4\nn_embd = 256\nvocab_size = 4096\n"
         "seq_len = 256\n",
         "", 8, 0},
    };
    for (const auto& m : models) run(m, threads, steps, rate, stream, update, peak);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
