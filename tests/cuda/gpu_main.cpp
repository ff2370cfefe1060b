// main() of the GPU tests: where no GPU is usable, or fewer GPUs than the
// ranks the launcher placed here (one rank per GPU), the test says why and
// exits 77, which CTest reports as skipped (SKIP_RETURN_CODE); otherwise
// doctest runs every case.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "comm/world.h"
#include "cuda/cuda_backend.h"
#include "ztrain/comm.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  // Listing the cases (test discovery) needs no GPU.
  if (!context.shouldExit()) {
    std::string why;
    const int gpus = ztrain::cuda::cuda_device_count(&why);
    if (gpus == 0) {
      std::printf("skipped: no usable GPU (%s)\n", why.c_str());
      return 77;
    }
    if (gpus < ztrain::local_rank_count()) {
      std::printf("skipped: %d ranks on this machine need %d GPUs; %d visible\n",
                  ztrain::local_rank_count(), ztrain::local_rank_count(), gpus);
      return 77;
    }
  }
  return context.run();
}
