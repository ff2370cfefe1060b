// main() of the GPU tests: where no GPU is usable the test says why and
// exits 77, which CTest reports as skipped (SKIP_RETURN_CODE); otherwise
// doctest runs every case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "cuda/cuda_backend.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  // Listing the cases (test discovery) needs no GPU.
  if (!context.shouldExit()) {
    std::string why;
    if (ztrain::cuda::cuda_device_count(&why) == 0) {
      std::printf("skipped: no usable GPU (%s)\n", why.c_str());
      return 77;
    }
  }
  return context.run();
}
