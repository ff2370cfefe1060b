#include "kernels/cpu/blas_core.h"

#include <array>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ztrain::blas {
namespace {

#if defined(__x86_64__)
// The vendor from cpuid leaf 0 (libgcc's model does not name Hygon).
CpuFeatures::Vendor vendor() {
  unsigned max_leaf = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &max_leaf, &b, &c, &d)) return CpuFeatures::Vendor::other;
  char name[13] = {};
  std::memcpy(name, &b, 4);
  std::memcpy(name + 4, &d, 4);
  std::memcpy(name + 8, &c, 4);
  if (!std::strcmp(name, "GenuineIntel")) return CpuFeatures::Vendor::intel;
  if (!std::strcmp(name, "AuthenticAMD")) return CpuFeatures::Vendor::amd;
  if (!std::strcmp(name, "HygonGenuine")) return CpuFeatures::Vendor::hygon;
  return CpuFeatures::Vendor::other;
}
#endif

// OpenBLAS 0.3.21's x86 families (its corename table) by the instruction
// set their sgemm kernels use.
constexpr std::array<std::pair<std::string_view, SimdLevel>, 26> kCores{{
    {"Katmai", SimdLevel::sse},
    {"Coppermine", SimdLevel::sse},
    {"Northwood", SimdLevel::sse},
    {"Prescott", SimdLevel::sse},
    {"Banias", SimdLevel::sse},
    {"Atom", SimdLevel::sse},
    {"Core2", SimdLevel::sse},
    {"Penryn", SimdLevel::sse},
    {"Dunnington", SimdLevel::sse},
    {"Nehalem", SimdLevel::sse},
    {"Athlon", SimdLevel::sse},
    {"Opteron", SimdLevel::sse},
    {"Opteron_SSE3", SimdLevel::sse},
    {"Barcelona", SimdLevel::sse},
    {"Nano", SimdLevel::sse},
    {"Bobcat", SimdLevel::sse},
    {"Sandybridge", SimdLevel::avx},
    {"Bulldozer", SimdLevel::avx},
    {"Piledriver", SimdLevel::avx},
    {"Steamroller", SimdLevel::avx},
    {"Haswell", SimdLevel::avx2},
    {"Excavator", SimdLevel::avx2},
    {"Zen", SimdLevel::avx2},
    {"SkylakeX", SimdLevel::avx512},
    {"Cooperlake", SimdLevel::avx512_bf16},
    {"SapphireRapids", SimdLevel::avx512_bf16},
}};

}  // namespace

const char* level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::sse:
      return "SSE";
    case SimdLevel::avx:
      return "AVX";
    case SimdLevel::avx2:
      return "AVX2";
    case SimdLevel::avx512:
      return "AVX-512";
    case SimdLevel::avx512_bf16:
      return "AVX-512 with bf16";
  }
  return "?";
}

CpuFeatures this_cpu() {
  CpuFeatures f;
#if defined(__x86_64__)
  // libgcc's CPU model, as the vector kernels' dispatch reads it
  // (vec::have_avx2_fma): a feature counts only where the OS saves its
  // registers (YMM for AVX, the opmask and ZMM state for AVX-512).
  // libztrain asks while it loads, perhaps before libgcc's own initialiser.
  __builtin_cpu_init();
  f.vendor = vendor();
  f.avx = __builtin_cpu_supports("avx");
  f.fma = __builtin_cpu_supports("fma");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

SimdLevel best_level(const CpuFeatures& cpu) {
  const bool avx2 = cpu.avx2 && cpu.fma;
  const bool avx512 =
      avx2 && cpu.avx512f && cpu.avx512dq && cpu.avx512cd && cpu.avx512bw && cpu.avx512vl;
  if (avx512) return cpu.avx512_bf16 ? SimdLevel::avx512_bf16 : SimdLevel::avx512;
  if (avx2) return SimdLevel::avx2;
  return cpu.avx ? SimdLevel::avx : SimdLevel::sse;
}

std::string core_for(const CpuFeatures& cpu) {
  switch (best_level(cpu)) {
    case SimdLevel::avx512_bf16:
      return "Cooperlake";
    case SimdLevel::avx512:
      return "SkylakeX";
    case SimdLevel::avx2:
      return cpu.vendor == CpuFeatures::Vendor::amd || cpu.vendor == CpuFeatures::Vendor::hygon
                 ? "Zen"
                 : "Haswell";
    case SimdLevel::avx:
      return "Sandybridge";
    case SimdLevel::sse:
      return "";
  }
  return "";
}

std::optional<SimdLevel> level_of_core(std::string_view core) {
  for (const auto& [name, level] : kCores)
    if (name == core) return level;
  return std::nullopt;
}

}  // namespace ztrain::blas
