// Which of OpenBLAS's kernel families ("core types": Haswell, SkylakeX,
// Cooperlake...) a CPU should run, as a pure function of the CPU's
// instruction-set features, and what each family's sgemm needs.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its family from the
// CPU's vendor and model numbers when it loads, and falls back to its SSE3
// kernels (Prescott) for a model it does not list: Debian 12's 0.3.21 does
// that on Emerald Rapids, at a third of the AVX-512 kernels' rate. The
// features say what the CPU can run whatever its model; blas.cpp hands this
// choice to OpenBLAS (OPENBLAS_CORETYPE) before the library initialises.
//
// Errors: none. Thread safety: pure functions, and this_cpu() reads the
// CPU's model (cpuid).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kit/kit_export.h"

namespace ztrain::blas {

// What an x86-64 CPU offers the GEMM kernels, with the operating system's
// support for the wider registers folded in (AVX needs the OS to save the
// YMM state, AVX-512 the opmask and ZMM state): a flag is set only where
// the instructions can run.
struct CpuFeatures {
  enum class Vendor { intel, amd, hygon, other } vendor = Vendor::other;
  bool avx = false, fma = false, avx2 = false;
  bool avx512f = false, avx512dq = false, avx512cd = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false;
};

// The instruction set a kernel family's sgemm is written in, in order:
// each runs on any CPU that runs the next.
enum class SimdLevel { sse, avx, avx2, avx512, avx512_bf16 };

ZTRAIN_KIT const char* level_name(SimdLevel level);

// This CPU, as libgcc's CPU model reads it (cpuid, with the OS's saved
// register state); all false off x86-64.
ZTRAIN_KIT CpuFeatures this_cpu();

// The best level the CPU runs. AVX-512 counts only with F, DQ, CD, BW and VL
// (what OpenBLAS's SkylakeX kernels use); AVX2 only with FMA.
ZTRAIN_KIT SimdLevel best_level(const CpuFeatures& cpu);

// The family OpenBLAS should run on this CPU: Cooperlake (AVX-512 with
// bf16), SkylakeX (AVX-512), Zen (AMD's and Hygon's AVX2: Haswell's
// kernels with Zen's blocking) or Haswell (AVX2), Sandybridge (AVX); empty
// below AVX, where OpenBLAS's own choice among its SSE families stands.
ZTRAIN_KIT std::string core_for(const CpuFeatures& cpu);

// The level a family's sgemm is written in; nullopt for a name this table
// does not know (a family newer than it).
ZTRAIN_KIT std::optional<SimdLevel> level_of_core(std::string_view core);

}  // namespace ztrain::blas
