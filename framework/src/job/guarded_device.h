// A development check that a model and a strategy would run on a GPU,
// on the CPU: `[device] guard = true` gives the run a cpu device whose
// device tier the host cannot touch. Each device-tier block is its own
// page-protected mapping, opened (PROT_READ | PROT_WRITE) only while the
// kernels, the device's movers (copy, copy_rows, convert, accumulate,
// fill_zero) or the strategy's communicator work on it, and closed again
// after; any other host access faults (SIGSEGV), at the line that would
// read garbage or crash on a GPU. host_visible(Tier::device) is false, so
// the staged paths a GPU takes run too. Internal to the host.
//
// World 1 only (the local communicator's copies happen inside the call
// that is opened around them; a real one works on other threads). Slow:
// every kernel call protects and unprotects every block.
// Thread safety: the training thread drives it.
#pragma once

#include <memory>

#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/kernels.h"

namespace ztrain {

struct GuardedCpu {
  std::unique_ptr<Device> device;
  std::unique_ptr<Kernels> kernels;  // the cpu kernels, opened around each op
  // Wraps a world-1 communicator so each collective runs opened.
  std::unique_ptr<Communicator> (*guard_comm)(std::unique_ptr<Communicator> inner, Device& device);
};

GuardedCpu make_guarded_cpu(int threads);

}  // namespace ztrain
