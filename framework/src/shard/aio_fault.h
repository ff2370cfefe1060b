// A test's fault of the NVMe tier: the `after`-th piece an AioEngine made
// from now on writes (1-based, counted per engine) fails with `error`
// (ENOSPC or EIO; 0: none), as a disk that fills or fails half-way. The
// host hands it over from its fault plan (io/fault_plan.h,
// ZTRAIN_TEST_INJECT_IO_ERROR); nothing in the SDK reads the environment.
//
// Thread safety: any thread; engines made before the call keep their plan.
#pragma once

#include "kit/kit_export.h"

namespace ztrain::shard {

ZTRAIN_KIT void plan_aio_error(int error, long after);

}  // namespace ztrain::shard
