// HostThreads: how many worker threads host kernels use, for as long as it
// lives: oneTBB's parallelism limit (process-wide, while the object
// exists) and OpenBLAS's thread count. The cpu device holds one for its
// kernels; a GPU run holds one for the cpu kernels that step offloaded
// state, so ranks sharing a machine share its cores there too.
// In libztrain, exported to the host (ZTRAIN_KIT). Thread safety: construct and destroy on one
// thread.
#pragma once

#include <oneapi/tbb/global_control.h>

#include "kit/kit_export.h"

namespace ztrain {

class ZTRAIN_KIT HostThreads {
 public:
  // threads <= 0: every hardware thread.
  explicit HostThreads(int threads);
  // One limit, one owner: a copy would lift it when either went.
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;
  int count() const { return threads_; }

 private:
  int threads_;
  oneapi::tbb::global_control limit_;
};

}  // namespace ztrain
