#include "loader/cuda_loader.h"

#include <boost/dll/shared_library.hpp>

#include <filesystem>
#include <system_error>

#include "comm/world.h"
#include "loader/plugin_loader.h"
#include "ztrain/comm.h"

namespace ztrain {
namespace {

struct Loaded {
  boost::dll::shared_library library;
  const cuda::Backend* backend = nullptr;
  std::string why;
};

Loaded load() {
  Loaded l;
  const std::filesystem::path file = cuda_backend_path();
  if (file.empty()) {
    l.why = "cannot find libztrain's own directory, where libztrain_cuda.so is looked for";
    return l;
  }
  if (!std::filesystem::exists(file)) {
    l.why = "this ztrain was built without the CUDA backend (no " + file.string() +
            "); build it where the CUDA toolkit is installed";
    return l;
  }
  std::error_code ec;
  l.library.load(file.string(), ec, boost::dll::load_mode::rtld_now);
  if (ec) {
    l.why = "cannot load " + file.string() + " (" + ec.message() +
            "): its CUDA libraries (libcudart, libcublasLt, libnccl) must be installed";
    return l;
  }
  if (!l.library.has("ztrain_cuda_backend")) {
    l.why = file.string() + " has no ztrain_cuda_backend entry point; reinstall ztrain";
    return l;
  }
  const cuda::Backend* b = l.library.get<const cuda::Backend*()>("ztrain_cuda_backend")();
  if (b->version != cuda::kBackendVersion) {
    l.why = file.string() + " is of another ztrain build (backend table " +
            std::to_string(b->version) + ", this ztrain reads " +
            std::to_string(cuda::kBackendVersion) + "); install the same build of both";
    return l;
  }
  l.backend = b;
  return l;
}

}  // namespace

std::filesystem::path cuda_backend_path() {
  const std::filesystem::path sdk = sdk_library_path();
  return sdk.empty() ? sdk : sdk.parent_path() / "libztrain_cuda.so";
}

std::string cuda_unusable() {
  std::string why;
  const cuda::Backend* backend = cuda_backend(&why);
  if (!backend) return why;
  if (!backend->make_nccl)
    return "this ztrain's CUDA backend was built without NCCL, which the strategies' "
           "collectives run on";
  const int gpus = backend->device_count(&why);
  if (gpus == 0) return "no usable GPU (" + why + ")";
  if (local_rank_count() > gpus)
    return std::to_string(local_rank_count()) + " ranks on this machine but " +
           std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") +
           " visible: start one rank per GPU (CUDA_VISIBLE_DEVICES names them)";
  return {};
}

const cuda::Backend* cuda_backend(std::string* why) {
  // Never unloaded: CUDA's libraries and NCCL's threads do not take being
  // unloaded at exit after the run's objects are gone.
  static const Loaded& loaded = *new Loaded(load());
  if (!loaded.backend && why) *why = loaded.why;
  return loaded.backend;
}

}  // namespace ztrain
