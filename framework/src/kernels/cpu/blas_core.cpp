#include "kernels/cpu/blas_core.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ztrain::blas {
namespace {

#if defined(__x86_64__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

bool bit(unsigned word, int n) {
  return (word >> n) & 1u;
}

// The register state the OS saves on a context switch (XCR0): without it,
// AVX or AVX-512 instructions fault even where cpuid lists them.
std::uint64_t os_saved_state() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

CpuFeatures::Vendor vendor_of(const Regs& leaf0) {
  char name[13] = {};
  std::memcpy(name, &leaf0.b, 4);
  std::memcpy(name + 4, &leaf0.d, 4);
  std::memcpy(name + 8, &leaf0.c, 4);
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
  const Regs leaf0 = cpuid(0, 0);
  f.vendor = vendor_of(leaf0);
  const Regs leaf1 = cpuid(1, 0);
  if (!bit(leaf1.c, 27)) return f;  // no OSXSAVE: the OS saves no vector state beyond SSE
  const std::uint64_t xcr0 = os_saved_state();
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
  f.avx = ymm && bit(leaf1.c, 28);
  f.fma = f.avx && bit(leaf1.c, 12);
  if (leaf0.a < 7) return f;
  const Regs leaf7 = cpuid(7, 0);
  f.avx2 = f.avx && bit(leaf7.b, 5);
  f.avx512f = zmm && bit(leaf7.b, 16);
  f.avx512dq = f.avx512f && bit(leaf7.b, 17);
  f.avx512cd = f.avx512f && bit(leaf7.b, 28);
  f.avx512bw = f.avx512f && bit(leaf7.b, 30);
  f.avx512vl = f.avx512f && bit(leaf7.b, 31);
  f.avx512_bf16 = f.avx512f && leaf7.a >= 1 && bit(cpuid(7, 1).a, 5);
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
