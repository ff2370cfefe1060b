// The CUDA backend, loaded on demand: libztrain_cuda.so is looked for
// beside libztrain (where the build and `cmake --install` put it) when a
// run asks for [device] kind = "cuda" or "auto", and kept loaded for the
// process. Internal to the host.
//
// Errors: cuda_backend() returns null, with the reason in *why, when the
// library is not there (a build without the CUDA toolkit) or cannot be
// loaded (its CUDA libraries missing).
// Thread safety: the first call loads; later calls return the same table.
#pragma once

#include <filesystem>
#include <string>

#include "kit/cuda_backend_abi.h"

namespace ztrain {

const cuda::Backend* cuda_backend(std::string* why);
// Where cuda_backend() looks for libztrain_cuda.so (beside libztrain).
std::filesystem::path cuda_backend_path();
// Why this process cannot train on a GPU, empty when it can: no CUDA
// backend, one built without NCCL, no usable GPU, or fewer GPUs than the
// ranks the launcher placed on this machine (one rank per GPU).
std::string cuda_unusable();

}  // namespace ztrain
