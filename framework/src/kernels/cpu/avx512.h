// The AVX-512 intrinsics, for the kernels with an AVX-512 path chosen at
// run time (vec::have_avx512()): adamw_avx512.cpp, exp_loops_avx512.cpp,
// block_gemm_avx512.cpp. ZTRAIN_AVX512 marks the functions the compiler
// may emit AVX-512 F, BW and VL instructions in; nothing else in a build
// for any x86-64 gets them.
//
// GCC 12 warns "(may be) used uninitialized" inside its own AVX-512
// headers, whose intrinsics start from _mm512_undefined_*() (GCC bug
// 105593, fixed in 13); the warnings are silenced for those headers only.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#define ZTRAIN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
