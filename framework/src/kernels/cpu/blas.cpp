#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <climits>
#include <cstdlib>

#include "ztrain/error.h"

namespace ztrain::blas {
namespace {

// The library's name as the dynamic loader finds it (its SONAME: Debian's
// alternatives point it at the pthread or OpenMP build installed).
constexpr const char* kSoname = "libopenblas.so.0";

using SgemmFn = decltype(&cblas_sgemm);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using NameFn = char* (*)();

struct Library {
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_threads = nullptr;
  GetThreadsFn get_threads = nullptr;
  Report report;
};

const char* vendor_name(CpuFeatures::Vendor v) {
  switch (v) {
    case CpuFeatures::Vendor::intel:
      return "Intel";
    case CpuFeatures::Vendor::amd:
      return "AMD";
    case CpuFeatures::Vendor::hygon:
      return "Hygon";
    case CpuFeatures::Vendor::other:
      break;
  }
  return "x86-64";
}

template <typename Fn>
Fn symbol(void* handle, const char* name, std::string& error) {
  void* p = dlsym(handle, name);
  if (!p && error.empty()) error = std::string(kSoname) + " has no symbol " + name;
  return reinterpret_cast<Fn>(p);
}

// "OpenBLAS 0.3.21" from "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string library_name(const char* config) {
  const std::string c = config ? config : "OpenBLAS";
  const std::size_t first = c.find(' ');
  const std::size_t second = first == std::string::npos ? first : c.find(' ', first + 1);
  return c.substr(0, second);
}

// Opens OpenBLAS with OPENBLAS_CORETYPE set to `core` for the duration (its
// initialiser reads it), then puts the environment back.
void* open_with(const std::string& core) {
  if (core.empty()) return dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  unsetenv("OPENBLAS_CORETYPE");
  return handle;
}

Library open_library() {
  Library lib;
  Report& r = lib.report;
  const CpuFeatures cpu = this_cpu();
  r.cpu_best = best_level(cpu);
  r.cpu = std::string(vendor_name(cpu.vendor)) + ", " + level_name(r.cpu_best);
  r.wanted = core_for(cpu);
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_NOLOAD);
  if (handle) {
    r.chosen_by = Report::ChosenBy::loaded_before;
  } else if (user && *user) {
    r.chosen_by = Report::ChosenBy::user;
    r.user_value = user;
    handle = open_with("");
  } else {
    r.chosen_by = r.wanted.empty() ? Report::ChosenBy::openblas : Report::ChosenBy::ztrain;
    handle = open_with(r.wanted);
  }
  if (!handle) {
    const char* why = dlerror();
    r.error = why ? why : kSoname;
    return lib;
  }
  lib.sgemm = symbol<SgemmFn>(handle, "cblas_sgemm", r.error);
  lib.set_threads = symbol<SetThreadsFn>(handle, "openblas_set_num_threads", r.error);
  lib.get_threads = symbol<GetThreadsFn>(handle, "openblas_get_num_threads", r.error);
  const auto corename = symbol<NameFn>(handle, "openblas_get_corename", r.error);
  const auto config = symbol<NameFn>(handle, "openblas_get_config", r.error);
  if (!r.error.empty()) return lib;
  r.core = corename();
  r.library = library_name(config());
  r.level = level_of_core(r.core);
  // A library built for one family ignores OPENBLAS_CORETYPE: what runs
  // is its choice, not ours.
  if (r.chosen_by == Report::ChosenBy::ztrain && r.core != r.wanted)
    r.chosen_by = Report::ChosenBy::openblas;
  return lib;
}

// Opened as libztrain loads: the one moment no other thread of ours can be
// reading the environment while open_with() changes it.
const Library& library() {
  static const Library lib = open_library();
  return lib;
}
[[maybe_unused]] const Library& opened_at_load = library();

int checked(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw InternalError(std::string("sgemm: ") + what + " = " + std::to_string(n) +
                        " is past OpenBLAS's 32-bit integers; split the GEMM");
  return static_cast<int>(n);
}

CBLAS_TRANSPOSE cblas_op(Op op) {
  return op == Op::transpose ? CblasTrans : CblasNoTrans;
}

}  // namespace

bool Report::below() const {
  return error.empty() && level && *level < cpu_best;
}

std::string Report::line() const {
  if (!error.empty()) return "OpenBLAS could not be opened: " + error;
  std::string s = library + ", " + core + " kernels";
  if (level) s += std::string(" (") + level_name(*level) + ")";
  switch (chosen_by) {
    case ChosenBy::ztrain:
      s += ", chosen by ztrain from this CPU's features";
      break;
    case ChosenBy::user:
      s += ", set by OPENBLAS_CORETYPE=" + user_value;
      break;
    case ChosenBy::openblas:
      s += ", chosen by OpenBLAS";
      break;
    case ChosenBy::loaded_before:
      s += ", chosen by OpenBLAS as it was loaded before libztrain";
      break;
  }
  return s + "; this CPU: " + cpu;
}

std::string Report::brief() const {
  return error.empty() ? library.substr(0, library.find(' ')) + " " + core : "no OpenBLAS";
}

std::string Report::warning() const {
  if (!below()) return "";
  std::string s = "warning: the GEMMs run OpenBLAS's " + core + " kernels (" + level_name(*level) +
                  "), below what this CPU runs (" + level_name(cpu_best) + ", " + wanted +
                  " kernels): ";
  switch (chosen_by) {
    case ChosenBy::user:
      return s + "OPENBLAS_CORETYPE=" + user_value + " is set; unset it to let ztrain choose";
    case ChosenBy::loaded_before:
      return s + "OpenBLAS was loaded into this process before libztrain; set " +
             "OPENBLAS_CORETYPE=" + wanted + " before it starts";
    case ChosenBy::ztrain:
    case ChosenBy::openblas:
      break;
  }
  return s + library + " does not take OPENBLAS_CORETYPE=" + wanted +
         " (a build for one family, without DYNAMIC_ARCH): install one that does (Debian's " +
         "libopenblas0-pthread)";
}

const Report& report() {
  return library().report;
}

void require() {
  const Report& r = report();
  if (!r.error.empty())
    throw Error("the cpu kernels need OpenBLAS, and " + std::string(kSoname) +
                " could not be opened (" + r.error +
                "): install it (scripts/install-deps.sh, or apt-get install libopenblas0)");
}

void sgemm(Op op_a, Op op_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
           const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
           std::size_t ldc) {
  library().sgemm(CblasRowMajor, cblas_op(op_a), cblas_op(op_b), checked(M, "M"), checked(N, "N"),
                  checked(K, "K"), alpha, A, checked(lda, "lda"), B, checked(ldb, "ldb"), beta, C,
                  checked(ldc, "ldc"));
}

int threads() {
  return library().get_threads();
}

void set_threads(int n) {
  library().set_threads(n);
}

}  // namespace ztrain::blas
