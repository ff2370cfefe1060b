// ReferenceKernels: the plain cpu implementation of every op, kept beside
// the fast one as the reference the tests compare it with (and the
// implementation of the ops that have no fast version yet).
#pragma once

#include <memory>

#include "kernels/kernel_ops.h"
#include "kit/kit_export.h"
#include "ztrain/kernels.h"

namespace ztrain {

// Every op, declared from the one op list (kernels/kernel_ops.h). The
// fused ops (add_layernorm_forward, add_rmsnorm_forward) are add, then the
// norm.
class ReferenceKernels : public Kernels {
 public:
  ZTRAIN_KERNEL_DECLARE_ALL
};

ZTRAIN_KIT std::unique_ptr<Kernels> make_reference_cpu_kernels();

}  // namespace ztrain
