// bench_gemm_libs: the GEMM libraries packaged for this machine at the
// shapes a training step runs, to choose by measurement (issue 34):
// OpenBLAS (what the kernels call, through kernels/cpu/blas.h: the kernel
// family libztrain chose, printed first), oneDNN's dnnl_sgemm (Debian's
// libdnnl2, the CPU library PyTorch uses) and BLIS (Debian's libblis4, its
// CBLAS layer). oneDNN and BLIS are opened at run time (dlopen, their own
// symbols first), so this builds without them and says which are missing.
//
// Each model's matmuls in their three forms: forward out (N, OC) = inp
// (N, C) W^T; dinp (N, C) = dout (N, OC) W; dW (OC, C) += dout^T inp. Per
// shape and form, each library runs `reps` times in a block after one
// warm-up call (blocks rather than alternating calls: the libraries' idle
// threads spin after a call and would steal the next library's cores), and
// the median is kept. The step's GEMM time per library weights each
// shape by its calls per step.
//
//   build/bin/bench_gemm_libs [--threads N] [--reps N]
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "stopwatch.h"

namespace {

using CblasSgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float,
                            const float*, int, const float*, int, float, float*, int);
// dnnl_status_t dnnl_sgemm(char transa, char transb, dnnl_dim_t M, N, K, float alpha, const
// float *A, dnnl_dim_t lda, const float *B, dnnl_dim_t ldb, float beta, float *C, dnnl_dim_t
// ldc): row-major.
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);

// C (M, N) = alpha op(A) op(B) + beta C, row-major, through one library
// (neither function: ztrain's OpenBLAS).
struct Library {
  std::string name;
  CblasSgemm cblas = nullptr;
  DnnlSgemm dnnl = nullptr;
  void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) const {
    if (dnnl) {
      dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    if (cblas) {
      cblas(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
            1.0f, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    using ztrain::blas::Op;
    auto z = [](int n) { return static_cast<std::size_t>(n); };
    ztrain::blas::sgemm(ta ? Op::transpose : Op::none, tb ? Op::transpose : Op::none, z(M), z(N),
                        z(K), 1.0f, A, z(lda), B, z(ldb), beta, C, z(ldc));
  }
};

void* open_library(const char* file) {
  void* h = ::dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) std::printf("%s: not loaded (%s)\n", file, ::dlerror());
  return h;
}

std::vector<Library> libraries() {
  std::vector<Library> out = {{"OpenBLAS", nullptr, nullptr}};
  if (void* h = open_library("libdnnl.so.2"))
    if (auto f = reinterpret_cast<DnnlSgemm>(::dlsym(h, "dnnl_sgemm")))
      out.push_back({"oneDNN", nullptr, f});
  if (void* h = open_library("libblis.so.4"))
    if (auto f = reinterpret_cast<CblasSgemm>(::dlsym(h, "cblas_sgemm")))
      out.push_back({"BLIS", f, nullptr});
  return out;
}

struct Shape {
  int N, C, OC, per_step;  // rows, in, out features; calls per step
};
struct Model {
  const char* name;
  std::vector<Shape> shapes;
};

// The matmuls of one step (attention's per-head products left out: they
// run single-threaded per head).
std::vector<Model> models() {
  const auto gpt2 = [](int N, int C, int V, int L) {
    return std::vector<Shape>{
        {N, C, 3 * C, L}, {N, C, C, L}, {N, C, 4 * C, L}, {N, 4 * C, C, L}, {N, C, V, 1}};
  };
  return {{"gpt2-124m 4x64", gpt2(256, 768, 50257, 12)},
          {"gpt2-tiny 8x256", gpt2(2048, 256, 4096, 4)},
          {"gpt2-tiny 4x256 (a world-2 rank)", gpt2(1024, 256, 4096, 4)},
          {"gpt2-124m 8x1024", gpt2(8192, 768, 50257, 12)}};
}

double seconds_of(const Library& lib, int form, const Shape& s, std::vector<float>& a,
                  std::vector<float>& b, std::vector<float>& c, int reps) {
  const auto run = [&] {
    switch (form) {
      case 0:  // forward: (N, OC) = (N, C) (OC, C)^T
        lib.gemm(false, true, s.N, s.OC, s.C, a.data(), s.C, b.data(), s.C, 0.0f, c.data(), s.OC);
        break;
      case 1:  // dinp: (N, C) = (N, OC) (OC, C)
        lib.gemm(false, false, s.N, s.C, s.OC, c.data(), s.OC, b.data(), s.C, 0.0f, a.data(), s.C);
        break;
      default:  // dW: (OC, C) += (N, OC)^T (N, C)
        lib.gemm(true, false, s.OC, s.C, s.N, c.data(), s.OC, a.data(), s.C, 1.0f, b.data(), s.C);
    }
  };
  run();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(ztrain::bench::timed(run));
  return ztrain::bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[++i]);
  }
  // Before the libraries start their thread pools; passive: an idle
  // OpenMP thread sleeps instead of spinning on the other library's cores.
  const std::string t = std::to_string(threads);
  ::setenv("OMP_NUM_THREADS", t.c_str(), 1);
  ::setenv("BLIS_NUM_THREADS", t.c_str(), 1);
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ztrain::blas::require();
  ztrain::blas::set_threads(threads);
  std::printf("OpenBLAS: %s\n", ztrain::blas::report().line().c_str());
  const std::vector<Library> libs = libraries();
  const char* forms[] = {"forward", "dinp", "dW"};
  std::printf("GFLOP/s, %d threads, median of %d\n", threads, reps);
  for (const Model& m : models()) {
    std::printf("\n%s\n  %-8s %6s %6s %6s", m.name, "form", "N", "C", "OC");
    for (const auto& l : libs) std::printf(" %9s", l.name.c_str());
    std::printf("\n");
    std::vector<double> step(libs.size(), 0.0);
    for (const Shape& s : m.shapes) {
      std::vector<float> a(static_cast<std::size_t>(s.N) * s.C, 0.01f),
          b(static_cast<std::size_t>(s.OC) * s.C, 0.02f),
          c(static_cast<std::size_t>(s.N) * s.OC, 0.03f);
      const double flops = 2.0 * s.N * s.C * s.OC;
      for (int form = 0; form < 3; ++form) {
        std::printf("  %-8s %6d %6d %6d", forms[form], s.N, s.C, s.OC);
        for (std::size_t l = 0; l < libs.size(); ++l) {
          const double sec = seconds_of(libs[l], form, s, a, b, c, reps);
          step[l] += sec * s.per_step;
          std::printf(" %9.1f", flops / sec / 1e9);
        }
        std::printf("\n");
      }
    }
    std::printf("  the step's GEMMs (ms):  ");
    for (std::size_t l = 0; l < libs.size(); ++l)
      std::printf(" %s %.1f%s", libs[l].name.c_str(), 1e3 * step[l],
                  l ? (" (" + std::to_string(step[0] / step[l]).substr(0, 4) + "x)").c_str() : "");
    std::printf("\n");
  }
  return 0;
}
