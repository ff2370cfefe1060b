// ZTRAIN_KIT: what libztrain exports beyond the SDK, for ztrain's own host
// (the executable and its tests) and its CUDA backend, which share one
// process with it: the collectives' tally and words (kit/collectives.h), the
// CUDA backend's entry table (kit/cuda_backend_abi.h), the process-wide
// temporary files and signal handling (core/temp_files.h, core/signals.h),
// the host's thread limit and name (core/host_threads.h, core/host_name.h),
// the reference kernels (kernels/cpu/reference_kernels.h), the GEMM library
// and its kernel family's choice (kernels/cpu/blas.h, blas_core.h), a test's
// fault of the NVMe tier (shard/aio_fault.h) and a test's hold points
// (core/hold_points.h).
//
// These headers are not installed and carry no compatibility promise: a
// plugin includes only include/ztrain, whose symbols are ZTRAIN_API. Every
// exported symbol of both kinds is listed in framework/exported_symbols.txt,
// which tests/sdk/exported_symbols.sh holds to the built library.
#pragma once

#define ZTRAIN_KIT __attribute__((visibility("default")))
