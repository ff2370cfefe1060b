#include "core/cuda_loader.h"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <filesystem>
#include <system_error>

namespace ztrain {
namespace {

struct Loaded {
  boost::dll::shared_library library;
  const cuda::Backend* backend = nullptr;
  std::string why;
};

Loaded load() {
  Loaded l;
  std::error_code ec;
  const std::filesystem::path self(boost::dll::symbol_location(cuda_backend, ec).string());
  const std::filesystem::path file = self.parent_path() / "libztrain_cuda.so";
  if (ec || !std::filesystem::exists(file)) {
    l.why = "this ztrain was built without the CUDA backend (no " + file.string() +
            "); build it where the CUDA toolkit is installed";
    return l;
  }
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
  l.backend = l.library.get<const cuda::Backend*()>("ztrain_cuda_backend")();
  return l;
}

}  // namespace

const cuda::Backend* cuda_backend(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.backend && why) *why = loaded.why;
  return loaded.backend;
}

}  // namespace ztrain
