#include "job/memory_check.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "job/rank_agreement.h"
#include "ztrain/units.h"

namespace ztrain {
std::uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0
             ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
             : 0;
}

namespace {

// a + b, saturating instead of wrapping.
std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t s = 0;
  return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

}  // namespace

std::uint64_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  unsigned long long kib = 0;
  for (std::string line; std::getline(meminfo, line);)
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return kib * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0
             ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
             : 0;
}

namespace {

// What the run takes of this machine's RAM: its ranks' model states (the
// device tier too where it is RAM) and activations, saturating.
struct Need {
  std::uint64_t states = 0, activations = 0, total = 0;
};

Need need_of(const MemoryEstimate& estimate, bool device_in_ram, std::uint64_t activation_bytes,
             int ranks_here) {
  Need n;
  n.activations = device_in_ram ? activation_bytes : 0;  // else they live on the GPU
  for (Tier t : {Tier::device, Tier::host}) {
    if (t == Tier::device && !device_in_ram) continue;
    for (std::uint64_t b : estimate.bytes[t]) n.states = add(n.states, b);
  }
  const std::uint64_t per_rank = add(n.states, n.activations);
  if (__builtin_mul_overflow(per_rank, static_cast<std::uint64_t>(ranks_here), &n.total))
    n.total = UINT64_MAX;
  return n;
}

std::string ranks_label(int ranks_here) {
  return std::to_string(ranks_here) + (ranks_here == 1 ? " rank" : " ranks");
}

// Why this host cannot hold the run; empty when it can (or its RAM is
// unknown).
std::string refusal(const RunConfig& config, const Need& need, int batch, int seq_len,
                    std::int64_t n_params, int ranks_here) {
  const std::uint64_t ram = physical_memory();
  if (ram == 0 || need.total <= ram) return {};
  const std::string why =
      need.activations >= need.states
          ? "activations of " + format_bytes(need.activations) +
                " per rank from [model] seq_len = " + std::to_string(seq_len) + " (" +
                config.where("model.seq_len") +
                ") x [train] micro_batch_size = " + std::to_string(batch) + " (" +
                config.where("train.micro_batch_size") +
                "), times the widths they multiply (n_embd, vocab_size); lower them"
          : "parameters, gradients and optimizer state of " + format_bytes(need.states) +
                " per rank from the model's " + std::to_string(n_params) +
                " parameters ([model] n_layer, n_embd and vocab_size); use a smaller model, more "
                "ranks on more machines, or a strategy that shards or offloads more (zero3, "
                "zero3_offload, zero3_nvme)";
  return "this run needs about " + format_bytes(need.total) + " of memory on this machine (" +
         ranks_label(ranks_here) + "), more than its " + format_bytes(ram) + " of RAM: mostly " +
         why;
}

}  // namespace

std::string check_memory_fits(const RunConfig& config, const MemoryEstimate& estimate,
                              bool device_in_ram, std::uint64_t activation_bytes, int batch,
                              int seq_len, std::int64_t n_params, int ranks_here,
                              Communicator& comm) {
  const Need need = need_of(estimate, device_in_ram, activation_bytes, ranks_here);
  const std::string why = refusal(config, need, batch, seq_len, n_params, ranks_here);
  // Hosts differ in RAM and in ranks: every rank learns whether any refused.
  stop_together(why,
                "the ranks of another host found that this run does not fit its memory (their "
                "message says why); nothing was allocated",
                comm);
  return memory_warning(need.total, available_memory(), ranks_here);
}

std::string memory_warning(std::uint64_t need, std::uint64_t available, int ranks_here) {
  if (available == 0 || need <= available) return {};
  return "warning: this run needs about " + format_bytes(need) + " of memory on this machine (" +
         ranks_label(ranks_here) + ", each category at its peak), more than the " +
         format_bytes(available) +
         " other processes leave free now (MemAvailable): if they keep it, the kernel may kill "
         "the run part-way; `ztrain estimate` shows where it goes";
}

}  // namespace ztrain
