// The GEMM library of the cpu kernels: OpenBLAS, which libztrain loads
// itself as it is loaded, having chosen the library's kernel family for
// this CPU first (blas_core.h).
//
// OpenBLAS (DYNAMIC_ARCH) picks its kernels once, in its own initialiser,
// from the CPU's model number or from OPENBLAS_CORETYPE. A library linked
// the usual way initialises before any code of ours runs, so libztrain does
// not link it: when libztrain loads (one thread, before main), it sets
// OPENBLAS_CORETYPE to the family the CPU's features call for, unless the
// user set it (a value the user set is always respected), opens the
// library, and puts the variable back as it was, so processes it starts
// choose for themselves. The calls below go through the library so opened.
//
// Thread safety: report() and threads() from any thread; set_threads()
// from one thread at a time (it is OpenBLAS's process-wide thread count);
// sgemm() from any number of threads at once, each call single-threaded
// when called inside another parallel loop (set_threads(1) first).
// Errors: require() throws Error when OpenBLAS could not be opened; the
// other calls assume it was (the cpu device calls require() as it opens).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "kernels/cpu/blas_core.h"
#include "kit/kit_export.h"

namespace ztrain::blas {

// How this process's GEMMs run.
struct ZTRAIN_KIT Report {
  std::string library;  // "OpenBLAS 0.3.21", as the library names itself
  std::string core;     // the kernel family running, OpenBLAS's name for it
  std::string cpu;      // the CPU's vendor and best level, "AMD, AVX-512 with bf16"
  // Who chose the family: ztrain from the CPU's features, the user through
  // OPENBLAS_CORETYPE, OpenBLAS itself (no choice of ours below AVX, or a
  // library built for one family), or whoever loaded OpenBLAS into the
  // process before libztrain.
  enum class ChosenBy { ztrain, user, openblas, loaded_before } chosen_by = ChosenBy::openblas;
  std::string user_value;          // OPENBLAS_CORETYPE as the user set it
  std::string wanted;              // the family this CPU's features call for; empty below AVX
  std::optional<SimdLevel> level;  // of `core`; nullopt for a family blas_core.h does not know
  SimdLevel cpu_best = SimdLevel::sse;
  std::string error;  // why OpenBLAS could not be opened; empty when it was

  // The running family is known and below what the CPU runs.
  bool below() const;
  // "OpenBLAS 0.3.21, Cooperlake kernels (AVX-512 with bf16), chosen by
  // ztrain from this CPU's features; this CPU: AMD, AVX-512 with bf16".
  std::string line() const;
  // "OpenBLAS Cooperlake", for the device's name.
  std::string brief() const;
  // Why the kernels are below the CPU and what to do; empty unless below().
  std::string warning() const;
};

ZTRAIN_KIT const Report& report();

// Throws Error naming the library and what to install when OpenBLAS could
// not be opened.
ZTRAIN_KIT void require();

enum class Op : unsigned char { none, transpose };

// C (M,N) = alpha op(A) op(B) + beta C, row-major: op(A) is (M,K), op(B)
// (K,N); lda, ldb, ldc are the row strides of A, B and C as stored, in
// floats. Throws Error for a dimension OpenBLAS's 32-bit integers cannot
// hold.
ZTRAIN_KIT void sgemm(Op op_a, Op op_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
                      const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta,
                      float* C, std::size_t ldc);

// OpenBLAS's thread count (process-wide).
ZTRAIN_KIT int threads();
ZTRAIN_KIT void set_threads(int n);

}  // namespace ztrain::blas
