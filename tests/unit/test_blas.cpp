// The GEMM library: the kernel family chosen for a CPU's features, this
// CPU's features against what the Linux kernel says of it (/proc/cpuinfo,
// read independently of cpuid), the family running against the one this
// CPU calls for, the report's lines, and sgemm against a plain triple loop.
#include <doctest/doctest.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "ztrain/error.h"

using namespace ztrain;
using namespace ztrain::blas;

namespace {

using Vendor = CpuFeatures::Vendor;

CpuFeatures avx2_cpu(Vendor v) {
  CpuFeatures f;
  f.vendor = v;
  f.avx = f.fma = f.avx2 = true;
  return f;
}

CpuFeatures avx512_cpu(Vendor v, bool bf16) {
  CpuFeatures f = avx2_cpu(v);
  f.avx512f = f.avx512dq = f.avx512cd = f.avx512bw = f.avx512vl = true;
  f.avx512_bf16 = bf16;
  return f;
}

// The first processor's lines of /proc/cpuinfo: its vendor_id and flags.
struct CpuInfo {
  std::string vendor;
  std::set<std::string> flags;
  bool has(const char* f) const { return flags.count(f) > 0; }
};

std::optional<CpuInfo> proc_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  if (!in) return std::nullopt;
  CpuInfo info;
  bool got_flags = false;
  for (std::string line; std::getline(in, line) && !got_flags;) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t"));
    std::istringstream value(line.substr(colon + 1));
    if (key == "vendor_id") value >> info.vendor;
    if (key == "flags") {
      for (std::string f; value >> f;) info.flags.insert(f);
      got_flags = true;
    }
  }
  if (!got_flags) return std::nullopt;
  return info;
}

// The family this test expects for a CPU, from the kernel's flag names
// (a table of its own, not blas_core's).
std::string expected_core(const CpuInfo& c) {
  const bool avx2 = c.has("avx2") && c.has("fma");
  const bool avx512 = avx2 && c.has("avx512f") && c.has("avx512dq") && c.has("avx512cd") &&
                      c.has("avx512bw") && c.has("avx512vl");
  if (avx512) return c.has("avx512_bf16") ? "Cooperlake" : "SkylakeX";
  if (avx2) return c.vendor == "AuthenticAMD" || c.vendor == "HygonGenuine" ? "Zen" : "Haswell";
  return c.has("avx") ? "Sandybridge" : "";
}

}  // namespace

TEST_CASE("the kernel family for a CPU's features") {
  // Emerald Rapids, Sapphire Rapids, Zen 4 and 5: AVX-512 with bf16.
  CHECK(core_for(avx512_cpu(Vendor::intel, true)) == "Cooperlake");
  CHECK(core_for(avx512_cpu(Vendor::amd, true)) == "Cooperlake");
  // Skylake-SP, Ice Lake: AVX-512 without bf16.
  CHECK(core_for(avx512_cpu(Vendor::intel, false)) == "SkylakeX");
  // AVX2: Intel's through Haswell's kernels, AMD's and Hygon's through Zen's.
  CHECK(core_for(avx2_cpu(Vendor::intel)) == "Haswell");
  CHECK(core_for(avx2_cpu(Vendor::other)) == "Haswell");
  CHECK(core_for(avx2_cpu(Vendor::amd)) == "Zen");
  CHECK(core_for(avx2_cpu(Vendor::hygon)) == "Zen");
  // AVX-512 F without VL and BW (Knights Landing) is not SkylakeX's set.
  CpuFeatures knl = avx2_cpu(Vendor::intel);
  knl.avx512f = knl.avx512cd = true;
  CHECK(best_level(knl) == SimdLevel::avx2);
  CHECK(core_for(knl) == "Haswell");
  // AVX2 without FMA runs no FMA kernel.
  CpuFeatures no_fma = avx2_cpu(Vendor::intel);
  no_fma.fma = false;
  CHECK(core_for(no_fma) == "Sandybridge");
  CpuFeatures avx;
  avx.avx = true;
  CHECK(core_for(avx) == "Sandybridge");
  // Below AVX, OpenBLAS's own choice among its SSE families stands.
  CHECK(core_for(CpuFeatures{}).empty());
  CHECK(best_level(CpuFeatures{}) == SimdLevel::sse);
}

TEST_CASE("each OpenBLAS family's instruction set") {
  CHECK(level_of_core("Prescott") == SimdLevel::sse);
  CHECK(level_of_core("Nehalem") == SimdLevel::sse);
  CHECK(level_of_core("Sandybridge") == SimdLevel::avx);
  CHECK(level_of_core("Haswell") == SimdLevel::avx2);
  CHECK(level_of_core("Zen") == SimdLevel::avx2);
  CHECK(level_of_core("SkylakeX") == SimdLevel::avx512);
  CHECK(level_of_core("Cooperlake") == SimdLevel::avx512_bf16);
  CHECK(level_of_core("SapphireRapids") == SimdLevel::avx512_bf16);
  CHECK_FALSE(level_of_core("haswell").has_value());  // OpenBLAS's names, as it spells them
  CHECK_FALSE(level_of_core("GraniteRapids").has_value());
  // Every family core_for names is one the table knows, at the CPU's level.
  for (const CpuFeatures& f : {avx2_cpu(Vendor::amd), avx2_cpu(Vendor::intel),
                               avx512_cpu(Vendor::intel, false), avx512_cpu(Vendor::intel, true)})
    CHECK(level_of_core(core_for(f)) == best_level(f));
}

TEST_CASE("this CPU's features are the ones the Linux kernel lists") {
  const auto info = proc_cpuinfo();
  if (!info) {
    MESSAGE("no /proc/cpuinfo flags: not checked");
    return;
  }
  const CpuFeatures f = this_cpu();
  CHECK(f.avx == info->has("avx"));
  CHECK(f.fma == info->has("fma"));
  CHECK(f.avx2 == info->has("avx2"));
  CHECK(f.avx512f == info->has("avx512f"));
  CHECK(f.avx512dq == info->has("avx512dq"));
  CHECK(f.avx512cd == info->has("avx512cd"));
  CHECK(f.avx512bw == info->has("avx512bw"));
  CHECK(f.avx512vl == info->has("avx512vl"));
  CHECK(f.avx512_bf16 == info->has("avx512_bf16"));
  CHECK((f.vendor == Vendor::amd) == (info->vendor == "AuthenticAMD"));
  CHECK((f.vendor == Vendor::intel) == (info->vendor == "GenuineIntel"));
}

TEST_CASE("the GEMM kernels running are the ones this CPU calls for, or the ones the user set") {
  const Report& r = report();
  REQUIRE(r.error.empty());
  CHECK(r.library.rfind("OpenBLAS ", 0) == 0);
  INFO(r.line());
  const auto info = proc_cpuinfo();
  if (!info) return;
  const std::string expected = expected_core(*info);
  CHECK(r.wanted == expected);
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (user && *user) {
    // Respected, and warned about when below the CPU.
    CHECK(r.chosen_by == Report::ChosenBy::user);
    CHECK(r.user_value == user);
    const std::string forced = user;
    if (forced == "Prescott" || forced == "Haswell") CHECK(r.core == forced);  // what CI forces
    CHECK(r.warning().empty() == !r.below());
  } else if (!expected.empty()) {
    CHECK(r.chosen_by == Report::ChosenBy::ztrain);
    CHECK(r.core == expected);
    CHECK_FALSE(r.below());
    CHECK(r.warning().empty());
    // The variable set for OpenBLAS's initialiser is gone again: processes
    // this one starts choose for themselves.
    CHECK(std::getenv("OPENBLAS_CORETYPE") == nullptr);
  }
  CHECK(r.line().find(r.core + " kernels") != std::string::npos);
}

TEST_CASE("the report's lines say who chose the kernels, and what to do when they are below") {
  Report r;
  r.library = "OpenBLAS 0.3.21";
  r.core = "Haswell";
  r.level = SimdLevel::avx2;
  r.cpu = "Intel, AVX-512 with bf16";
  r.cpu_best = SimdLevel::avx512_bf16;
  r.wanted = "Cooperlake";
  r.chosen_by = Report::ChosenBy::user;
  r.user_value = "Haswell";
  CHECK(r.below());
  CHECK(r.brief() == "OpenBLAS Haswell");
  CHECK(r.line() ==
        "OpenBLAS 0.3.21, Haswell kernels (AVX2), set by OPENBLAS_CORETYPE=Haswell; this CPU: "
        "Intel, AVX-512 with bf16");
  CHECK(r.warning() ==
        "warning: the GEMMs run OpenBLAS's Haswell kernels (AVX2), below what this CPU runs "
        "(AVX-512 with bf16, Cooperlake kernels): OPENBLAS_CORETYPE=Haswell is set; unset it to "
        "let ztrain choose");
  r.chosen_by = Report::ChosenBy::loaded_before;
  CHECK(r.warning().find("loaded into this process before libztrain; set "
                         "OPENBLAS_CORETYPE=Cooperlake") != std::string::npos);
  r.chosen_by = Report::ChosenBy::openblas;
  CHECK(r.warning().find("does not take OPENBLAS_CORETYPE=Cooperlake") != std::string::npos);
  // At the CPU's level, or a family the table does not know: no warning.
  r.core = "Cooperlake";
  r.level = SimdLevel::avx512_bf16;
  CHECK(r.warning().empty());
  r.core = "GraniteRapids";
  r.level = std::nullopt;
  CHECK_FALSE(r.below());
  CHECK(r.line().find("GraniteRapids kernels, chosen by OpenBLAS") != std::string::npos);
}

TEST_CASE("sgemm computes alpha op(A) op(B) + beta C with row strides, every transpose") {
  const std::size_t M = 5, N = 7, K = 9, pad = 3;
  auto value = [](std::size_t i, std::size_t j, int salt) {
    return static_cast<float>((i * 7 + j * 3 + static_cast<std::size_t>(salt)) % 11) - 5.0f;
  };
  for (const Op op_a : {Op::none, Op::transpose})
    for (const Op op_b : {Op::none, Op::transpose}) {
      // A stored (M,K) or (K,M), B (K,N) or (N,K), each row padded.
      const std::size_t a_rows = op_a == Op::none ? M : K, a_cols = op_a == Op::none ? K : M;
      const std::size_t b_rows = op_b == Op::none ? K : N, b_cols = op_b == Op::none ? N : K;
      const std::size_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      std::vector<float> A(a_rows * lda), B(b_rows * ldb), C(M * ldc);
      for (std::size_t i = 0; i < a_rows; ++i)
        for (std::size_t j = 0; j < a_cols; ++j) A[i * lda + j] = value(i, j, 1);
      for (std::size_t i = 0; i < b_rows; ++i)
        for (std::size_t j = 0; j < b_cols; ++j) B[i * ldb + j] = value(i, j, 2);
      for (std::size_t i = 0; i < C.size(); ++i) C[i] = static_cast<float>(i % 5);
      const std::vector<float> C0 = C;
      sgemm(op_a, op_b, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
      for (std::size_t m = 0; m < M; ++m)
        for (std::size_t n = 0; n < N; ++n) {
          double sum = 0;  // small integers and halves: exact in any order
          for (std::size_t k = 0; k < K; ++k) {
            const float a = op_a == Op::none ? A[m * lda + k] : A[k * lda + m];
            const float b = op_b == Op::none ? B[k * ldb + n] : B[n * ldb + k];
            sum += static_cast<double>(a) * b;
          }
          CHECK(C[m * ldc + n] == 0.5 * sum + 2.0 * C0[m * ldc + n]);
        }
      // The padding between rows is not written.
      for (std::size_t m = 0; m < M; ++m)
        for (std::size_t n = N; n < ldc; ++n) CHECK(C[m * ldc + n] == C0[m * ldc + n]);
    }
}

TEST_CASE("sgemm refuses a dimension OpenBLAS's 32-bit integers cannot hold") {
  const std::size_t big = static_cast<std::size_t>(INT_MAX) + 1;
  float x = 0;
  CHECK_THROWS_WITH_AS(sgemm(Op::none, Op::none, big, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &x, 1),
                       doctest::Contains("M = 2147483648 is past OpenBLAS's 32-bit integers"),
                       InternalError);
  CHECK_THROWS_AS(sgemm(Op::none, Op::none, 1, 1, 1, 1.0f, &x, big, &x, 1, 0.0f, &x, 1),
                  InternalError);
}
