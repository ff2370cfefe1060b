// A run whose memory cannot exist on this machine is refused before it
// allocates anything.
//
// On the cpu device every tier but nvme is this machine's RAM (on a GPU
// only the host tier is: the device tier's budget and the card's memory
// are checked as it allocates). Before the
// strategy allocates, the host adds up its estimate (device and host
// tiers, every category at its peak) and the model's activations, times
// the ranks sharing the machine; when that exceeds the physical memory,
// the run stops with a ConfigError naming the larger part and the keys
// that make it large (the sequence length and micro-batch for
// activations, the model's shape for its states), instead of failing
// part-way through setup or the first step, or being killed by the kernel.
// Hosts differ in memory and in ranks, so the verdict is agreed: when any
// rank refuses, every rank stops. A run that fits the RAM but not what
// other processes leave available now is not refused (they may end), but
// warned of: the kernel would kill it part-way.
//
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "ztrain/comm.h"
#include "ztrain/strategy.h"

namespace ztrain {

// estimate: the strategy's for this run; activation_bytes: the model's for
// one micro-batch of `batch` sequences of `seq_len`; ranks_here: ranks on
// this machine; device_in_ram: the device tier (and the activations) are
// RAM, as on the cpu device; on a GPU only the host tier is.
// Returns the warning for this rank's machine, or empty.
std::string check_memory_fits(const RunConfig& config, const MemoryEstimate& estimate,
                              bool device_in_ram, std::uint64_t activation_bytes, int batch,
                              int seq_len, std::int64_t n_params, int ranks_here,
                              Communicator& comm);

// The warning for a run that needs `need` bytes of this machine where
// `available` (MemAvailable; 0: unknown) are free; empty when they are
// enough.
std::string memory_warning(std::uint64_t need, std::uint64_t available, int ranks_here);

// The memory this machine can still give without swapping (MemAvailable),
// or 0 where unknown.
std::uint64_t available_memory();

// This machine's RAM, or 0 where unknown.
std::uint64_t physical_memory();

}  // namespace ztrain
