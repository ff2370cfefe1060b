#include "core/host_threads.h"

#include <cblas.h>

#include <cstddef>
#include <thread>

namespace ztrain {

HostThreads::HostThreads(int threads)
    : threads_(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency())),
      limit_(oneapi::tbb::global_control::max_allowed_parallelism,
             static_cast<std::size_t>(threads_)) {
  openblas_set_num_threads(threads_);
}

}  // namespace ztrain
