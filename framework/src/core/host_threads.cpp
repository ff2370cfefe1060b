#include "core/host_threads.h"

#include "kernels/cpu/blas.h"

#include <cstddef>
#include <thread>

namespace ztrain {

HostThreads::HostThreads(int threads)
    : threads_(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency())),
      limit_(oneapi::tbb::global_control::max_allowed_parallelism,
             static_cast<std::size_t>(threads_)) {
  blas::require();
  blas::set_threads(threads_);
}

}  // namespace ztrain
