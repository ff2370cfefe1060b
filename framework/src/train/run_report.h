// What a finished run reports: the figures the console summary prints,
// gathered in one place by the training loop.
//
// run_header is the run's opening lines (model, data, batch, precision,
// what the strategy offloads); summary_text the closing ones (time,
// throughput, final losses, overflow skips, communication, measured peaks
// per tier and category beside the strategy's estimate, where the outputs
// are). Both are pure functions of their arguments, so what a run prints
// can be tested, and other readers (metrics, comparisons) read the same
// figures.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ztrain/device.h"
#include "ztrain/strategy.h"

namespace ztrain {

struct RunHeader {
  std::string model_plugin, arch, data_description, strategy_plugin, device_name;
  std::int64_t n_params = 0;
  std::int64_t micro_batch = 0, grad_accum = 0, global_batch = 0;
  int ranks = 1, seq_len = 0;
  int data_ranks = 1;        // what [parallel] leaves of the ranks for data parallelism
  std::string mesh;          // the mesh's dimensions above 1 and how they split; empty: data only
  std::string comm_backend;  // how the ranks talk (mpi, gloo), said when ranks > 1
  std::string placement;     // where the ranks run (job/placement.h); empty: not said
  std::string cores;         // how ranks sharing a host split its cores; empty: not said
  std::optional<double> entropy_rate;
  DType precision = DType::f32, grad_dtype = DType::f32, activation_dtype = DType::f32;
  double loss_scale = 1;            // static scale (fp16), 0: dynamic
  int initial_scale_power = 0;      // dynamic fp16
  std::filesystem::path init_from;  // empty: from the seed
  std::string init_note;         // how the weights reached the ranks, when not each from the file
  std::string strategy_summary;  // empty: nothing to say
};

struct RunReport {
  std::int64_t steps = 0;
  double wall_s = 0;
  double tokens_per_s = 0;
  std::optional<double> trained_per_s;  // where the data masks targets
  double flops_per_token = 0;
  std::vector<double> train_losses;                         // per step
  std::vector<std::pair<std::int64_t, double>> val_losses;  // (step, loss)
  std::optional<double> entropy_rate;
  std::int64_t skipped_steps = 0;
  bool dynamic_scale = false;
  double final_loss_scale = 1;
  int ranks = 1;
  std::uint64_t bytes_per_rank = 0;            // over the training steps
  double comm_wait_s = 0;                      // over the training steps
  MemoryStats memory;                          // peaks, largest over ranks
  std::optional<std::uint64_t> device_budget;  // [device] memory_limit, when set
  MemoryEstimate estimate;                     // the strategy's, for the same run
  std::filesystem::path metrics_file;
  std::optional<std::filesystem::path> weights_file;
};

std::string run_header(const RunHeader& h);
std::string summary_text(const RunReport& r);

}  // namespace ztrain
